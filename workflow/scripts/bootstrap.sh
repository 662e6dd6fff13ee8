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
    # --no-compile: byte-compiling every installed module took more than half of the install on 2 cores;
    # Python compiles (and caches) only the modules a run imports, on first import.
    if ! .venv/bin/pip install --disable-pip-version-check --no-compile -e '.[workflow,dev]' >.venv/install.log 2>&1; then
        tail -30 .venv/install.log >&2
        echo "bootstrap: pip install failed; the whole log is in .venv/install.log" >&2
        exit 1
    fi
    rm -f .venv/.installed-*
    touch "$stamp"
fi
