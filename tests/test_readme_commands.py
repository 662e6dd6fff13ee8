"""The commands the README and docs/ show: CI runs the README's test command, and every other command names a
module, flags, profiles, experiments and files that exist."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from sacglam_core.pipeline.experiments import DEFINITION_FILES, load_definitions

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MODULE = re.compile(r"python -m (sacglam_core(?:\.\w+)+)((?:[ \t]+[^\s`|;&)#]+)*)")
OLDER = re.compile(r"git (?:checkout|show) ([0-9a-f]{7,40})")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def readme_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Install and test", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_has_two_commands_and_ci_runs_the_test_one_first():
    setup, tests = readme_commands()
    assert "bootstrap.sh" in setup and "snakemake --profile profiles/local" in setup and "pytest" in tests
    ci = [
        line
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci[0] == tests  # then, deliberately, the slow suites
    assert ci[1:] == ['.venv/bin/python -m pytest -m "slow or slurm"']


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def shown(pattern: re.Pattern) -> list[tuple[str, re.Match]]:
    return [(page.relative_to(ROOT).as_posix(), m) for page in PAGES for m in pattern.finditer(page.read_text())]


def module_source(module: str, page_text: str) -> str | None:
    """The module's source in this tree, else at a commit the page names (`git checkout <commit>`): a study whose
    code was removed is documented with the revision that runs it."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin:
        main = Path(spec.origin).parent / "__main__.py" if spec.submodule_search_locations else None
        return Path(spec.origin).read_text() + (main.read_text() if main else "")
    path = module.replace(".", "/") + ".py"
    for commit in OLDER.findall(page_text):
        shown_file = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if shown_file.returncode == 0:
            return shown_file.stdout
    return None


@pytest.mark.parametrize("page, command", [(p, m.group(0)) for p, m in shown(MODULE)])
def test_every_module_command_names_a_module_and_its_flags(page, command):
    module, arguments = MODULE.fullmatch(command).groups()
    source = module_source(module, (ROOT / page).read_text())
    assert source is not None, f"{page}: {command}: no module {module}, here or at a commit the page names"
    for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", arguments):
        assert f'"{flag}"' in source, f"{page}: {command}: {module} has no option {flag}"


def test_every_profile_experiment_and_link_exists():
    experiments = set(load_definitions(*(ROOT / f for f in DEFINITION_FILES))["experiments"])
    problems = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(ROOT)
        for profile in re.findall(r"--profile (\S+)", text):
            if not (ROOT / profile.strip("`'\").,")).is_dir():
                problems.append(f"{where}: profile {profile}")
        named = re.findall(r"experiments=\[([^\]<]*)\]", text) + re.findall(r"(?:pipeline\.|`)claims (\w+)", text)
        for name in ",".join(named).split(","):
            if name.strip() and name.strip() not in experiments:
                problems.append(f"{where}: experiment {name.strip()}")
        for target in LINK.findall(text):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                problems.append(f"{where}: link {target}")
    assert not problems


QUOTED_ERROR = re.compile(
    r"`(?:error: )?(profiles/slurm/cluster\.yaml:(\d+):\s+(launcher\.\w+):\s+(.+?)\s+is\s[^`]*)`", re.S
)


@pytest.mark.parametrize(
    "page, quoted", [(p, m) for p, m in shown(QUOTED_ERROR)], ids=[f"{p}:{m[3]}" for p, m in shown(QUOTED_ERROR)]
)
def test_a_quoted_cluster_file_error_is_what_the_example_gives(tmp_path, page, quoted):
    """A quoted error of the cluster file is the one a copy of cluster.example.yaml gives with that value: the same
    line, the same words."""
    from sacglam_core.pipeline.config import WorkflowConfigError, load_workflow_config

    message, line, key, value = quoted.groups()
    leaf = key.split(".")[-1]
    lines = (ROOT / "profiles" / "slurm" / "cluster.example.yaml").read_text().splitlines()
    for number, text in enumerate(lines):
        name, _, rest = text.strip().partition(":")
        if name == leaf:
            lines[number] = text[: text.index(name)] + f"{name}: {value}"
        elif re.match(r"\s*<[^>]*>", rest):
            lines[number] = text[: text.index(name)] + f"{name}: null"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkflowConfigError) as error:
        load_workflow_config([], {"cluster_file": str(cluster)})
    produced = str(error.value).replace(str(cluster), "profiles/slurm/cluster.yaml")
    assert produced.startswith(" ".join(message.split())), f"{page}: quotes {message!r}, the example gives {produced!r}"
