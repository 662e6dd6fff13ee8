"""Figures README quotes, regenerated from the code: the demo's random policy and its start (the prior's step-0
evaluation, as every run of `mini` makes it). A change that moves one fails here until the text says it."""

import re
import subprocess
import sys
from pathlib import Path

import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.config import parse_config
from sacglam_core.evaluation import agent_policy, evaluate
from sacglam_core.pipeline.claims import random_success
from sacglam_core.pipeline.experiments import DEFINITION_FILES, expand, load_definitions

ROOT = Path(__file__).resolve().parents[1]


def quoted() -> tuple[str, str]:
    """README's demo table row `the prior / random policy | <start> / <random>`."""
    found = re.search(r"\| the prior / random policy \| ([0-9.]+) / ([0-9.]+) \|", (ROOT / "README.md").read_text())
    assert found, "README.md's demo table has no `the prior / random policy` row"
    return found.group(1), found.group(2)


def test_the_demos_start_and_random_policy_are_what_readme_quotes(tmp_path):
    build = [sys.executable, "-m", "sacglam_core.models", "build-pretrained", str(tmp_path)]
    subprocess.run(build, check=True, capture_output=True)  # the shipped weights, as the demo's set-up writes them
    definitions = load_definitions(*[ROOT / f for f in DEFINITION_FILES])
    config = parse_config(expand(definitions, ["mini"], "unused", {"models": str(tmp_path)})[0].settings)
    start, random = quoted()
    assert f"{random_success(config):.3f}" == random
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    agent = GlamAgent.from_config(AgentConfig(config.model, max_candidates=config.env.max_candidates))
    assert f"{evaluate(lambda: agent_policy(agent, config, 0), config)['eval_success']:.3f}" == start
