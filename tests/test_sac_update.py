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
            "monitor": {"policy_kl_every": 0},  # a diagnostic the reference update does not measure
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


def loop_polyak(sources, targets, tau):
    """Polyak averaging one tensor at a time, as before it took one call."""
    with torch.no_grad():
        for s, t in zip(sources, targets, strict=True):
            t.lerp_(s.to(t.dtype), tau)


def test_updates_give_the_losses_and_gradients_of_the_path_before_the_host_light_loop(tmp_path, tiny_models):
    """In float64 on the CPU, three SAC-GLAM+HER updates with the paper's critic and LoRA: the masks the scorer makes
    against those transformers makes from the 2D masks, fused Adam against its default path, Polyak averaging in
    one call against one per tensor. Every loss and every gradient is the same."""
    import sacglam_core.agent.critic as critic_module
    import sacglam_core.agent.lm as lm_module
    import sacglam_core.algos.sac as sac_module
    from sacglam_core.agent import AgentConfig, GlamAgent
    from sacglam_core.agent.tokens import PromptTokens
    from sacglam_core.benchmarks.step_cost import random_play
    from sacglam_core.distributed import init_ranks
    from sacglam_core.envs.playground import ACTION_VOCABULARY
    from sacglam_core.evaluation import goal_type_prior

    config = parse_config(
        {
            "algorithm": "sac",
            "model": {"name_or_path": str(tiny_models["tiny-t5"]), "lora": {}},
            "output_dir": str(tmp_path),
            "num_envs": 8,
            "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
            "her": {"enabled": True},
            "sac": {"batch_size": 16, "update_every": 8, "warmup_cycles": 0, "critic": {"hidden_units": 32}},
        }
    )
    runs = []
    for before in (False, True):
        with pytest.MonkeyPatch.context() as patch:
            if before:
                patch.setattr(lm_module.GlamLM, "_mask", lambda self, padding, **_: padding)
                patch.setattr(sac_module, "adam", lambda params, lr: torch.optim.Adam(params, lr=lr))
                patch.setattr(critic_module, "polyak", loop_polyak)
                patch.setattr(lm_module, "polyak", loop_polyak)
            torch.manual_seed(0)
            agent = GlamAgent.from_config(AgentConfig(config.model, critic=config.sac.critic), ACTION_VOCABULARY)
            agent.double()
            sac = sac_module.SAC(agent, config, init_ranks(), goal_type_prior(config.env))
            for episode in random_play(PromptTokens(agent.lm.tokenizer), 40, 8, env=config.env).episodes:
                sac.add(episode)
            seen, step = [], sac._step

            def recorded(optimizer, params, loss, clip=True, step=step, seen=seen):
                step(optimizer, params, loss, clip)
                seen.append((loss.detach(), [p.grad.clone() for p in params if p.grad is not None]))

            sac._step = recorded
            for _ in range(3):
                sac._update(env_steps=10**6)
            runs.append(seen)
    new, old = runs
    assert len(new) == len(old) == 9  # critic, actor and alpha, three times
    for (loss, grads), (old_loss, old_grads) in zip(new, old):
        assert loss.dtype == torch.float64 and len(grads) == len(old_grads) > 0
        torch.testing.assert_close(loss, old_loss, rtol=1e-12, atol=1e-12)
        for a, b in zip(grads, old_grads):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
