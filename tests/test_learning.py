"""Learning checks on the tiny model (slow: run with `pytest -m slow`)."""

import csv

import pytest

from sacglam_core.config import parse_config
from sacglam_core.distributed import Ranks
from sacglam_core.evaluation import evaluate, random_policy
from sacglam_core.trainer import Trainer

pytestmark = pytest.mark.slow


def test_sac_her_rises_clearly_above_the_random_policy(tmp_path, tiny_models):
    """SAC-GLAM+HER on the simplified environment (horizon 8): about 4 minutes on one core."""
    config = parse_config(
        {
            "algorithm": "sac",
            "model": {"name_or_path": str(tiny_models["tiny-causal"])},
            "output_dir": str(tmp_path / "run"),
            "total_steps": 6400,
            "num_envs": 32,
            "threads": 1,
            "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
            "sac": {
                "batch_size": 64,
                "actor_lr": 1e-3,
                "critic_lr": 1e-3,
                "gamma": 0.9,
                "alpha_init": 0.05,
                "target_entropy": 0.3,
                "critic": {"input": "decoded_action", "weights": "separate", "hidden_units": 256},
            },
            "her": {"enabled": True},
            # 128 episodes per goal type: at 32, one evaluation of the same policy spreads by about 0.075 (SD).
            "eval": {"every_steps": 3200, "episodes_per_type": 128, "test_episodes": 32},
        }
    )
    random_success = evaluate(lambda: random_policy(seed=0), config, Ranks())["eval_success"]
    assert Trainer(config).run() == 0
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    untrained, final = float(rows[0]["eval_success"]), float(rows[-1]["eval_success"])
    assert abs(untrained - random_success) < 0.1  # the tiny model starts as a near-uniform policy
    assert final >= random_success + 0.25, (random_success, [r["eval_success"] for r in rows])
