#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv in .venv with the project and its pinned dependencies.
# Idempotent: it reinstalls only when pyproject.toml has changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing the project into .venv (first run: one to two minutes)" >&2
    # pyproject pins torch==2.13.0; on this kind of machine pip's find-links serves its CPU wheel.
    if ! .venv/bin/pip install --disable-pip-version-check --no-compile -e '.[train,workflow,dev]' >.venv/install.log 2>&1; then
        tail -30 .venv/install.log >&2
        echo "bootstrap: pip install failed; the whole log is in .venv/install.log" >&2
        exit 1
    fi
    # Byte-compiled once, in parallel: where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) Python
    # never caches what it compiles, and every trainer, Snakemake and test process spent 15 s more compiling
    # torch and transformers (26 s against 11 s to import them on 2 cores).
    .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null 2>&1 || true
    rm -f .venv/.installed-*
    touch "$stamp"
fi
