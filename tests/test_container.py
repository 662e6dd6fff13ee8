"""The Apptainer definition, checked without the apptainer binary: it parses, its base image is pinned by digest,
its packages come from a lock file with hashes that agrees with pyproject, it holds no copy of the code, and
its test checks the V100's architecture."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from spython.main.parse.parsers import SingularityParser

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = ROOT / "containers" / "sacglam.def"
LOCK = ROOT / "containers" / "requirements.lock"


@pytest.fixture(scope="module")
def recipe():
    (recipe,) = SingularityParser(str(DEFINITION)).recipe.values()
    return recipe


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def core_pins() -> dict[str, str]:
    """The image's pins: the core dependencies and the trainer's (`train`)."""
    required = [Requirement(r) for r in [*project()["dependencies"], *project()["optional-dependencies"]["train"]]]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in required)
    return {canonicalize_name(r.name): next(iter(r.specifier)).version for r in required}


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of every requirement in the lock file."""
    entries = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s\\]+)", block)
        if match:
            entries[canonicalize_name(match.group(1))] = (
                match.group(2),
                len(re.findall(r"--hash=sha256:[0-9a-f]{64}", block)),
            )
    return entries


def test_definition_parses_with_a_base_image_pinned_by_digest(recipe):
    image, _, digest = recipe.fromHeader.partition("@")
    assert image.startswith("python:3.11") and re.fullmatch(r"sha256:[0-9a-f]{64}", digest), recipe.fromHeader
    assert SpecifierSet(project()["requires-python"]).contains(image.split(":")[1].split("-")[0])
    assert "HF_HUB_OFFLINE=1" in recipe.environ  # compute nodes run offline; models are staged before
    assert "PYTHONNOUSERSITE=1" in recipe.environ


def test_one_copy_of_the_code_the_repository(recipe):
    """The image holds the dependencies only; the workflow binds the repository and sets PYTHONPATH to it. It carries
    its definition and lock where a run reads their SHA-256 (its identity, which gpu_smoke checks)."""
    from sacglam_core.runfiles import IMAGE_DIR, IMAGE_FILES

    copied = dict(line.split() for line in recipe.files)
    assert copied == {f"containers/{name}": str(IMAGE_DIR / name) for name in IMAGE_FILES.values()}
    assert all((ROOT / p).exists() for p in copied)
    assert not any(
        "sacglam" in line and "pip install" in line and "requirements.lock" not in line for line in recipe.install
    )


def test_packages_come_from_the_lock_file_with_hashes_and_agree_with_pyproject(recipe):
    assert any("--require-hashes -r /opt/sacglam/requirements.lock" in line for line in recipe.install)
    entries = locked()
    assert entries and all(hashes >= 1 for _, hashes in entries.values())
    pins = core_pins()
    torch = pins.pop("torch")
    assert {name: entries[name][0] for name in pins} == pins  # every core dependency, at pyproject's version
    assert "torch" not in entries and not any(name.startswith("nvidia-") for name in entries)
    torch_line = next(line for line in recipe.install if "torch==" in line)
    assert f"torch=={torch}" in torch_line


def test_torch_comes_from_a_cuda_index_that_supports_volta(recipe):
    torch_line = next(line for line in recipe.install if "torch==" in line)
    match = re.search(r"download\.pytorch\.org/whl/cu(\d+)", torch_line)
    assert match, torch_line
    assert 118 <= int(match.group(1)) < 130  # CUDA 13 builds no longer run on V100 (sm_70)
    assert recipe.test == "/bin/bash /tests.sh"  # spython turns %test into this script, written in install
    test = "\n".join(line for line in recipe.install if line.endswith(">> /tests.sh"))
    assert "arch = torch.cuda.get_arch_list()" in test and 'assert "sm_70" in arch' in test
