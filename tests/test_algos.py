"""SAC-GLAM and PPO-GLAM updates on the tiny model: the critic warm-up and the optimizer steps."""

import random

import pytest
import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.algos.sac import SAC
from sacglam_core.config import SACConfig, parse_config
from sacglam_core.distributed import Ranks
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import goal_type_prior
from sacglam_core.trajectories import EpisodeRecorder

TINY_ENV = {"n_objects": 3, "simplified": True, "max_steps": 8}


def run_config(model, algorithm: str, **settings):
    return parse_config(
        {"algorithm": algorithm, "model": {"name_or_path": str(model)}, "num_envs": 8, "env": TINY_ENV, **settings}
    )


def random_episodes(agent: GlamAgent, config, steps: int = 64) -> list:
    """Finished episodes of the uniform random policy, recorded as the trainer records them."""
    envs = VectorPlayground(config.num_envs, config.env, seed=0)
    recorder = EpisodeRecorder(agent.tokens)
    obs, infos = envs.reset()
    recorder.reset(infos["goal"], obs, infos["possible_actions"])
    rng, episodes = random.Random(0), []
    for _ in range(steps // config.num_envs):
        choices = [rng.randrange(len(c)) for c in recorder.candidates()]
        actions = [ACTION_VOCABULARY[c[k]] for c, k in zip(recorder.candidates(), choices)]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        episodes += recorder.step(choices, rewards, terminated, truncated, obs, infos, {})
    return episodes


def sac_on_tiny(model, **sac):
    config = run_config(
        model, "sac", sac={"batch_size": 8, "critic": {"input": "decoded_action", "hidden_units": 32}, **sac}
    )
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig(config.model, critic=config.sac.critic), ACTION_VOCABULARY)
    algo = SAC(agent, config, Ranks(), goal_type_prior(config.env))
    for episode in random_episodes(agent, config):
        algo.add(episode)
    return algo


def stepped_optimizers(algo: SAC) -> list[str]:
    """Names of the optimizers that `_step` steps, in order (it is the one place steps happen)."""
    names = {id(algo.actor_optimizer): "actor", id(algo.critic_optimizer): "critic", id(algo.alpha_optimizer): "alpha"}
    calls: list[str] = []
    step = algo._step

    def spy(optimizer, *args, **kwargs):
        calls.append(names[id(optimizer)])
        return step(optimizer, *args, **kwargs)

    algo._step = spy
    return calls


def test_default_warmup_is_magellans_critic_only_cycles(tiny_models):
    """MAGELLAN (magellan/main.py): `update_policy = warmup_updates < nb_updates`, nb_updates counting
    update cycles from 0, with warmup_updates: 10 in its configs: the first 11 cycles train the critic alone."""
    assert SACConfig().warmup_cycles == 11
    algo = sac_on_tiny(tiny_models["tiny-t5"])
    calls = stepped_optimizers(algo)
    log_alpha = algo.log_alpha.item()
    per_cycle = algo.cfg.updates_per_cycle
    for cycle in range(11):
        algo.update(None, env_steps=10_000 * (cycle + 1))
        assert calls == ["critic"] * per_cycle * (cycle + 1), cycle
    assert algo.log_alpha.item() == log_alpha and not algo.actor_optimizer.state
    algo.update(None, env_steps=120_000)  # the 12th cycle: the actor and alpha learn too
    assert calls[-3 * per_cycle :] == ["critic", "actor", "alpha"] * per_cycle
    assert algo.log_alpha.item() != log_alpha and algo.actor_optimizer.state


@pytest.mark.parametrize(
    "warmup, first_actor_cycle",
    [({"warmup_cycles": 0}, 0), ({"warmup_cycles": 0, "warmup_updates": 3}, 1), ({"warmup_cycles": 2}, 2)],
)
def test_warmup_units(tiny_models, warmup, first_actor_cycle):
    algo = sac_on_tiny(tiny_models["tiny-t5"], **warmup)
    calls = stepped_optimizers(algo)
    for cycle in range(first_actor_cycle + 1):
        algo.update(None, env_steps=10_000 * (cycle + 1))
        assert ("actor" in calls) == (cycle >= first_actor_cycle), cycle
