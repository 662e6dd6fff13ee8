"""The Apptainer definition, checked without the apptainer binary: it parses, and its pins are the project's."""

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


@pytest.fixture(scope="module")
def recipe():
    (recipe,) = SingularityParser(str(DEFINITION)).recipe.values()
    return recipe


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for token in re.findall(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", " ".join(lines)):
        name, version = token.split("==")
        found[canonicalize_name(name)] = version
    return found


def test_definition_parses_with_the_expected_sections(recipe):
    assert recipe.fromHeader.startswith("python:3.11")
    assert SpecifierSet(project()["requires-python"]).contains("3.11")
    copied = {line.split()[0] for line in recipe.files}
    assert {"pyproject.toml", "sacglam_core"} <= copied
    assert all((ROOT / path).exists() for path in copied)
    assert "HF_HUB_OFFLINE=1" in recipe.environ  # compute nodes run offline; models are staged before
    assert any("pip install --no-deps /opt/sacglam" in line for line in recipe.install)


def test_container_pins_equal_the_projects_core_dependencies(recipe):
    required = {canonicalize_name(Requirement(r).name): Requirement(r) for r in project()["dependencies"]}
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in required.values())
    expected = {name: next(iter(r.specifier)).version for name, r in required.items()}
    assert pins(recipe.install) == expected


def test_torch_comes_from_a_cuda_index_that_supports_volta(recipe):
    torch_line = next(line for line in recipe.install if "torch==" in line)
    match = re.search(r"download\.pytorch\.org/whl/cu(\d+)", torch_line)
    assert match, torch_line
    assert 118 <= int(match.group(1)) < 130  # CUDA 13 builds no longer run on V100 (sm_70)
