"""The SAC update with its LLM passes shared and skipped gives the numbers of the straightforward update.

The reference (benchmarks/sac_reference.py) is the update as it was before its passes were shared and
skipped (issue 14): every pass on its own, s_{t+n} through the LLM for every row, the target critic on a
pass of its own. A short training run with each gives the same metrics within float tolerance.
"""

import csv
import math

import numpy as np
import pytest
import torch

from sacglam_core.benchmarks.sac_reference import reference_update
from sacglam_core.config import parse_config
from sacglam_core.metrics import TIMING_COLUMNS
from sacglam_core.trainer import Trainer

CRITICS = {  # the one-pass critic reading the target from the policy's pass; the paper's critic; the mini's (last)
    "decoded_action shared": ("tiny-causal", {"input": "decoded_action", "target_lm": False, "hidden_units": 32}),
    "obs_action shared": ("tiny-t5", {"input": "obs_action", "hidden_units": 32}),
    "decoded_action separate": ("tiny-causal", {"input": "decoded_action", "weights": "separate", "hidden_units": 32}),
    "decoded_action separate, no target LM": (
        "tiny-causal",
        {"input": "decoded_action", "weights": "separate", "target_lm": False, "hidden_units": 32},
    ),
}


def metrics_of(tmp_path, model, critic, update=None) -> list[dict]:
    config = parse_config(
        {
            "algorithm": "sac",
            "model": {"name_or_path": str(model)},
            "output_dir": str(tmp_path),
            "total_steps": 256,
            "num_envs": 8,
            "threads": 1,
            "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
            "her": {"enabled": True},
            "sac": {"batch_size": 16, "update_every": 16, "warmup_updates": 4, "critic": critic},
            "eval": {"every_steps": 64, "episodes_per_type": 4, "test_episodes": 4},
            "checkpoint": {"every_updates": 1000},
        }
    )
    trainer = Trainer(config)
    if update is not None:
        trainer.algo._update = update.__get__(trainer.algo)
    assert trainer.run() == 0
    with (tmp_path / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(f)]


@pytest.mark.parametrize("name", list(CRITICS))
def test_restructured_update_gives_the_reference_numbers(tmp_path, tiny_models, name):
    torch.set_num_threads(1)
    model, critic = CRITICS[name]
    new = metrics_of(tmp_path / "new", tiny_models[model], critic)
    old = metrics_of(tmp_path / "old", tiny_models[model], critic, reference_update)
    assert_same_metrics(new, old)


def test_prompt_keys_read_in_place_give_the_copied_caches_numbers(tmp_path, tiny_models, monkeypatch):
    """The mini's critic trained with actions attending to their prompt's keys in place (agent/shared_prompt.py)
    and with the cache copied per action."""
    torch.set_num_threads(1)
    model, critic = CRITICS["decoded_action separate, no target LM"]
    new = metrics_of(tmp_path / "new", tiny_models[model], critic)
    monkeypatch.setattr("sacglam_core.agent.lm.supports_shared_prompt", lambda model: False)
    old = metrics_of(tmp_path / "old", tiny_models[model], critic)
    assert_same_metrics(new, old)


def assert_same_metrics(new: list[dict], old: list[dict]) -> None:
    assert [r["env_steps"] for r in new] == [r["env_steps"] for r in old] and int(new[-1]["updates"]) > 4
    for a, b in zip(new, old):
        for column in a:
            x, y = float(a[column] or "nan"), float(b[column] or "nan")
            assert (math.isnan(x) and math.isnan(y)) or np.isclose(x, y, rtol=1e-4, atol=1e-6), (column, x, y)
