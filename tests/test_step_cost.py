"""The FLOP and memory accounting at the Flan-T5-base shape: its agent counts the GPU's static shapes; end to end
(slow: run with `pytest -m slow`)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_counted_agent_pads_its_batches_as_a_gpu_run_does():
    """FLOPs counted at the GPU's shapes: every prompt with the environment's most candidate slots."""
    from sacglam_core.benchmarks.step_cost import counting_agent, paper_config

    config = paper_config("sac", her=True)
    agent = counting_agent(config)
    host = agent.collate([[3, 4, 5]], [[[6], [7]]])
    assert agent.lm.shapes.static and host.arrays["action_ids"].shape[1] == config.env.max_candidates > 2


@pytest.mark.slow
def test_step_cost_prints_every_part_for_each_algorithm():
    command = [sys.executable, "-m", "sacglam_core.benchmarks.step_cost", "--quick", "--batches", "1", "--steps", "40"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    number = r"\s+([\d.]+)"
    pattern = r"^((?:PPO|SAC)[^\d]+?)" + number * 5
    rows = {m[0].strip(): m[1:] for m in re.findall(pattern, result.stdout, re.M)}
    assert {
        "PPO-GLAM",
        "SAC-GLAM+HER / obs_action, shared",
        "SAC-GLAM+HER / decoded_action, shared, no target LM",
    } <= set(rows)
    acting, critic, actor, evaluation, total = map(float, rows["SAC-GLAM+HER / obs_action, shared"])
    assert min(acting, critic, actor, evaluation) > 0 and abs(acting + critic + actor + evaluation - total) < 0.2
    assert float(rows["PPO-GLAM"][1]) == 0.0  # PPO has no critic update
    one_pass, with_target_lm = (rows[f"SAC-GLAM+HER / decoded_action, shared{x}"] for x in (", no target LM", ""))
    assert float(one_pass[1]) < float(with_target_lm[1])  # its target is read from the policy's pass
    assert "the paper: 80 GPU-hours per 400K-step seed" in result.stdout


def test_the_padded_share_counts_what_static_shapes_add():
    """`--padding`: with each batch's own shapes the same batch runs fewer FLOPs (no empty candidate slot filled)."""
    from sacglam_core.benchmarks.step_cost import counting_agent, paper_config

    config = paper_config("sac", her=True)
    static, own = counting_agent(config), counting_agent(config, static=False)
    assert static.lm.shapes.static and not own.lm.shapes.static
    assert own.collate([[3, 4, 5]], [[[6], [7]]]).arrays["action_ids"].shape[1] == 2
