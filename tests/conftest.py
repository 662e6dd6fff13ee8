"""Shared fixtures: the tiny models are built once per test session, offline."""

import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from sacglam_core.cpu import pin_kernels  # noqa: E402

pin_kernels()  # as the command lines do, so that a model built here has their bytes


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of the tiny T5 and the tiny causal LM, built by the command line a user runs."""
    out = tmp_path_factory.mktemp("models")
    subprocess.run([sys.executable, "-m", "sacglam_core.tiny", "build-tiny", str(out)], check=True, capture_output=True)
    return {name: out / name for name in ("tiny-t5", "tiny-causal")}


@pytest.fixture(params=["tiny-t5", "tiny-causal"])
def tiny_path(request, tiny_models):
    return str(tiny_models[request.param])


def copy_cluster_profile(destination, name="mycluster", **values):
    """profiles/slurm copied as a user does (`cp -r profiles/slurm profiles/<name>`), with its cluster.yaml made
    from cluster.example.yaml: the placeholders set (partition `gpu`, no account) and `values` over the launcher's
    keys (a `budget` mapping over the budget's)."""
    import shutil
    from pathlib import Path

    import yaml

    profile = Path(destination) / "profiles" / name
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "profiles" / "slurm", profile, ignore=shutil.ignore_patterns("cluster.yaml"))
    cluster = yaml.safe_load((profile / "cluster.example.yaml").read_text())
    budget = values.pop("budget", {})
    cluster["launcher"] |= {"partition": "gpu", "account": None, **values}
    cluster["budget"] |= budget
    (profile / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    return profile


@pytest.fixture
def cluster_profile(tmp_path):
    return copy_cluster_profile(tmp_path)
