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
    subprocess.run(
        [sys.executable, "-m", "sacglam_core.models", "build-tiny", str(out)], check=True, capture_output=True
    )
    return {name: out / name for name in ("tiny-t5", "tiny-causal")}


@pytest.fixture(params=["tiny-t5", "tiny-causal"])
def tiny_path(request, tiny_models):
    return str(tiny_models[request.param])
