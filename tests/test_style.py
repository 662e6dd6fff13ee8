"""The code passes the project's linter and formatter (configured in pyproject.toml); benchmarks and studies are
listed commands that pin their torch threads."""

import ast
import re
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


# modules imported, not run
LIBRARIES: dict[str, set[str]] = {"benchmarks": {"faults", "flops", "kernels"}, "studies": set()}


@pytest.mark.parametrize("package", sorted(LIBRARIES))
def test_every_benchmark_and_study_is_a_listed_command_that_pins_its_threads(package):
    """Each module of benchmarks/ and studies/ but the libraries is a command (`main`, run as __main__) that takes
    --threads (default 1) and uses it, so none oversubscribes a shared machine by torch's default; its
    package's docstring names it."""
    directory = ROOT / "sacglam_core" / package
    listing = ast.get_docstring(ast.parse((directory / "__init__.py").read_text())) or ""
    modules = sorted(p for p in directory.glob("*.py") if p.stem != "__init__")
    commands = [p for p in modules if p.stem not in LIBRARIES[package]]
    assert commands and {p.stem for p in modules} >= LIBRARIES[package]
    problems = []
    for path in modules:
        source = path.read_text()
        functions = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
        if not re.search(rf"\b{path.stem}\b", listing):
            problems.append(f"{path.name}: not in {package}/__init__.py's docstring")
        if path in commands and not (
            "main" in functions
            and 'if __name__ == "__main__":' in source
            and "add_threads_argument(parser)" in source
            and "args.threads" in source
        ):
            problems.append(f"{path.name}: no main() taking and using --threads")
        if path not in commands and "main" in functions:
            problems.append(f"{path.name}: a library with a main(); list it as a command")
    assert not problems, problems
