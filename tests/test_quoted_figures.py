"""Figures README quotes, regenerated from the code: the demo's random policy and its start (the prior's step-0
evaluation, the mean of its rounds, as every run of `mini` makes it), and the budgets. A change that moves one fails
here until the text says it."""

import re
import subprocess
import sys
from pathlib import Path

import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.config import parse_config
from sacglam_core.evaluation import agent_policy, evaluate
from sacglam_core.pipeline.experiments import DEFINITION_FILES, expand, load_definitions
from sacglam_core.reports.claims import random_success

ROOT = Path(__file__).resolve().parents[1]


def quoted() -> tuple[str, str]:
    """README's demo table row `the prior / random policy | <start> / <random>`."""
    found = re.search(r"\| the prior / random policy \| ([0-9.]+) / ([0-9.]+) \|", (ROOT / "README.md").read_text())
    assert found, "README.md's demo table has no `the prior / random policy` row"
    return found.group(1), found.group(2)


def test_the_demos_start_and_random_policy_are_what_readme_quotes(tmp_path):
    build = [sys.executable, "-m", "sacglam_core.tiny", "build-pretrained", str(tmp_path)]
    subprocess.run(build, check=True, capture_output=True)  # the shipped weights, as the demo's set-up writes them
    definitions = load_definitions(*[ROOT / f for f in DEFINITION_FILES])
    config = parse_config(expand(definitions, ["mini"], "unused", {"models": str(tmp_path)})[0].settings)
    start, random = quoted()
    assert f"{random_success(config):.3f}" == random
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    agent = GlamAgent.from_config(AgentConfig(config.model, max_candidates=config.env.max_candidates))
    rounds = [
        evaluate(lambda r=r: agent_policy(agent, config, r), config)["eval_success"]
        for r in range(config.eval.start_rounds)
    ]  # as the trainer evaluates a run's start: the mean of its rounds
    assert f"{sum(rounds) / len(rounds):.3f}" == start


def priced(experiments: list[str], gpu: str, gpus_per_node: int, tmp_path) -> dict[str, float]:
    """GPU-hours per experiment as the dry run prices new runs (the committed calibration table and rates)."""
    from sacglam_core.jobs import budget as budgeting

    definitions = load_definitions(*[ROOT / f for f in DEFINITION_FILES])
    runs = expand(definitions, experiments, tmp_path / "results")
    calibration = budgeting.load_calibration(ROOT / "workflow" / "config" / "calibration.yaml", tmp_path)
    limits = budgeting.Limits(time_min=1200, signal_delay_s=120, max_requeues=20)
    plan = budgeting.make_budget(runs, gpus_per_node, gpu, calibration, limits, tmp_path)
    out: dict[str, float] = {}
    for estimate in plan.estimates:
        out[estimate.run.experiment] = out.get(estimate.run.experiment, 0.0) + estimate.gpu_hours
    return out


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_budgets_readme_and_the_docs_quote_are_what_the_dry_run_prices(tmp_path):
    """README's table of the paper's experiments on V100s (the example cluster file's type) and the H200 totals of
    both layouts; docs/autotelic.md's and docs/cluster.md's figures."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| [^|]+ \| `(\w+)` \| (\d+) \| ([\d,.]+) \|$", readme, re.M)
    assert len(rows) == 6, "README.md's experiment table"
    v100 = priced([name for name, _, _ in rows], "V100", 1, tmp_path)
    assert {name: f"{hours:,.1f}" for name, hours in v100.items()} == {name: hours for name, _, hours in rows}
    total = re.search(r"^\| all \| \| \d+ \| ([\d,.]+) \|$", readme, re.M).group(1)
    assert f"{sum(v100.values()):,.1f}" == total
    h200 = {g: sum(priced([name for name, _, _ in rows], "H200", g, tmp_path).values()) for g in (1, 4)}
    one, each = re.search(r"on an H200 the six cost ([\d,.]+) GPU-hours against ([\d,.]+)", readme).groups()
    assert (f"{h200[1]:,.1f}", f"{h200[4]:,.1f}") == (one, each)
    cluster = (ROOT / "docs" / "cluster.md").read_text()
    assert f"{h200[1]:,.1f} GPU-hours for the six paper experiments against {h200[4]:,.1f}" in " ".join(cluster.split())
    autotelic = " ".join((ROOT / "docs" / "autotelic.md").read_text().split())
    quoted = re.search(
        r"prices its (\d+) runs at ([\d,.]+) GPU-hours on V100s .* H100s, from gpu_check's H200 rates, ([\d,.]+) with "
        r"each run's four ranks on one GPU \(`gpus_per_node: 1`\) or ([\d,.]+) with a GPU each",
        autotelic,
    ).groups()
    runs = len(expand(load_definitions(*[ROOT / f for f in DEFINITION_FILES]), ["autotelic"], tmp_path))
    figures = [
        priced(["autotelic"], gpu, g, tmp_path)["autotelic"] for gpu, g in (("V100", 1), ("H100", 1), ("H100", 4))
    ]
    assert quoted == (str(runs), *(f"{f:,.1f}" for f in figures))
