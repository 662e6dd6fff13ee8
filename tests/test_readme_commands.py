"""The README's two commands: CI runs the same test command a new user runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", quick_start, re.S)]


def test_readme_has_two_commands_and_ci_runs_the_test_one_first():
    setup, tests = readme_commands()
    assert "bootstrap.sh" in setup and "pytest" in tests
    ci = [
        line
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci[0] == tests  # then, deliberately, the slow suites
    assert ci[1:] == ['.venv/bin/python -m pytest -m "slow or slurm"']
