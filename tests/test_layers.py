"""The package's layers (pyproject.toml's import-linter contract, docs/architecture.md): kept by the code as it
is, broken by one import against the grain."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_the_package_keeps_its_layers():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_import_against_the_grain_breaks_them(tmp_path):
    shutil.copytree(ROOT / "sacglam_core", tmp_path / "sacglam_core", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    monitor = tmp_path / "sacglam_core" / "monitor.py"
    monitor.write_text(monitor.read_text() + "\nfrom sacglam_core.jobs import status  # noqa: E402, F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sacglam_core.monitor -> sacglam_core.jobs.status" in result.stdout


def test_the_reports_importing_the_jobs_breaks_them(tmp_path):
    """The workflow's two sides stand apart: aggregation reads results and never reaches into job submission."""
    shutil.copytree(ROOT / "sacglam_core", tmp_path / "sacglam_core", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    claims = tmp_path / "sacglam_core" / "reports" / "claims.py"
    claims.write_text(claims.read_text() + "\nfrom sacglam_core.jobs import runstate  # noqa: E402, F401\n")
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sacglam_core.reports.claims -> sacglam_core.jobs.runstate" in result.stdout
