#!/usr/bin/env bash
# Regenerate containers/requirements.lock: the core and `train` dependencies of pyproject.toml and all of theirs, pinned
# with hashes, for Python 3.11 on x86_64 Linux (the image's). torch and its CUDA packages are left out: the
# image installs torch's CUDA 12.6 build from PyTorch's own index (see containers/sacglam.def).
# Needs uv (pip install uv==0.9.30) and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
excluded=(torch triton cuda-bindings cuda-pathfinder cuda-toolkit)
excluded+=($(uv pip compile pyproject.toml --extra train --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --quiet --no-header 2>/dev/null | grep -oE '^nvidia-[a-z0-9-]+' || true))
args=()
for package in "${excluded[@]}"; do args+=(--no-emit-package "$package"); done
uv pip compile pyproject.toml --extra train --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
    "${args[@]}" --custom-compile-command "bash containers/lock.sh" -o containers/requirements.lock
