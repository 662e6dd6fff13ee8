"""The code passes the project's linter and formatter (configured in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(RUFF is None, reason="ruff is installed with the dev extra")
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    result = subprocess.run(
        [RUFF, *command, "sacglam_core", "tests", "workflow"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_benchmark_pins_and_prints_its_threads():
    """Benchmarks take --threads (default 1), so none oversubscribes a shared machine by torch's default."""
    benchmarks = ROOT / "sacglam_core" / "benchmarks"
    scripts = [p for p in benchmarks.glob("*.py") if "def main(" in p.read_text()]
    assert len(scripts) >= 8
    missing = [p.name for p in scripts if "add_threads_argument(parser)" not in p.read_text()]
    assert not missing, f"benchmarks without --threads: {missing}"
