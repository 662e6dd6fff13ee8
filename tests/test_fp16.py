"""float16 as a V100 computes: the loss scaler's steps are device work alone (a captured update replays them), and a
gradient overflow skips exactly its step, shrinks the scale and training goes on."""

import numpy as np
import pytest
import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.static import HostReadError, NoHostReads
from sacglam_core.algos.ppo import PPO
from sacglam_core.benchmarks.faults import ForcedOverflow
from sacglam_core.distributed import Ranks
from sacglam_core.envs.playground import ACTION_VOCABULARY
from tests.test_algos import rollout, run_config, sac_on_tiny

FP16 = {"dtype": "float16", "lora": {"r": 4}, "static_shapes": True}


def checked_for_host_reads(agent: GlamAgent) -> None:
    """Every call of a function the agent wraps (what a GPU captures) runs under NoHostReads."""
    run = agent.graphs.run

    def checked(key, fn, inputs):
        with NoHostReads():
            return run(key, fn, inputs)

    agent.graphs.run = checked


def test_a_host_read_inside_device_work_is_caught():
    with pytest.raises(HostReadError), NoHostReads():
        torch.ones(2).sum().item()
    with NoHostReads():
        torch.ones(2).sum().mul(3)


def ppo_on_tiny(model):
    config = run_config(model, "ppo", FP16, ppo={"rollout_steps": 64, "minibatch_size": 32, "epochs": 1})
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig.of_run(config), ACTION_VOCABULARY)
    algo = PPO(agent, config, Ranks())
    episodes, recorder = rollout(agent, config, algo=algo)
    for episode in episodes:
        algo.add(episode)
    return algo, recorder


def test_float16_sac_updates_read_nothing_on_the_host_and_an_overflow_skips_exactly_its_step(tiny_models):
    algo = sac_on_tiny(tiny_models["tiny-t5"], FP16, warmup_cycles=0, updates_per_cycle=1)
    assert algo.agent.plan.loss_scaling and algo.scalers[algo.critic_optimizer].is_enabled()
    checked_for_host_reads(algo.agent)
    critic = algo.scalers[algo.critic_optimizer]
    fault = ForcedOverflow(algo.critic_optimizer, "cpu")
    with fault.installed():
        for _ in range(2):
            algo.update(None, env_steps=10_000)
        assert float(algo.health.skipped) == 0
        scale, steps = critic.get_scale(), float(algo.health.steps)
        actor_own = {id(p) for p in algo.actor_params}
        critic_own = [p for p in algo.critic_params if id(p) not in actor_own]  # the head (and its own adapters)
        before = {
            "critic": [p.detach().clone() for p in critic_own],
            "actor": [p.detach().clone() for p in algo.actor_params],
        }
        critic_state = [s["step"].clone() for s in algo.critic_optimizer.state.values()]
        fault.arm()
        algo.update(None, env_steps=10_000)
        fault.disarm()
        assert float(algo.health.skipped) == 1 and float(algo.health.steps) == steps + 3  # critic, actor, alpha
        assert critic.get_scale() == scale / 2  # the scaler's backoff
        assert critic_own and all(torch.equal(a, p) for a, p in zip(before["critic"], critic_own))
        assert [s["step"] for s in algo.critic_optimizer.state.values()] == critic_state
        assert any(not torch.equal(a, p) for a, p in zip(before["actor"], algo.actor_params))
        for _ in range(2):
            algo.update(None, env_steps=10_000)
    assert float(algo.health.skipped) == 1 and algo.divergence() is None
    assert any(not torch.equal(a, p) for a, p in zip(before["critic"], critic_own))
    stats = algo.pop_stats()
    assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("critic_loss", "actor_loss", "mean_q"))


def test_float16_ppo_steps_read_nothing_on_the_host_and_an_overflow_skips_exactly_its_step(tiny_models):
    algo, recorder = ppo_on_tiny(tiny_models["tiny-t5"])
    checked_for_host_reads(algo.agent)
    fault = ForcedOverflow(algo.optimizer, "cpu")
    params = [p for p in algo.params if p.requires_grad]
    with fault.installed():
        fault.arm()
        before = [p.detach().clone() for p in params]
        scale = algo.scaler.get_scale()
        algo.update([recorder], env_steps=64)  # 2 minibatch steps, both poisoned
        fault.disarm()
        assert float(algo.health.skipped) == 2 and algo.scaler.get_scale() == scale / 4
        assert all(torch.equal(a, p) for a, p in zip(before, params))
        episodes, recorder = rollout(algo.agent, algo.config, algo=algo)
        for episode in episodes:
            algo.add(episode)
        algo.update([recorder], env_steps=128)
    assert float(algo.health.skipped) == 2 and algo.divergence() is None
    assert any(not torch.equal(a, p) for a, p in zip(before, params))


def test_with_check_host_reads_a_wrapped_functions_last_eager_call_fails_on_a_host_read(tiny_models):
    """`model.check_host_reads`: what the agent wraps for capture fails loudly on a host read in its last eager call
    (the one before a GPU captures, where the read would otherwise be frozen into the graph); its first call, which
    may compile blocks (and compilation reads the host), is not checked."""
    config = run_config(tiny_models["tiny-t5"], "sac", {"check_host_reads": True})
    agent = GlamAgent.from_config(AgentConfig.of_run(config), ACTION_VOCABULARY)
    assert agent.plan.host_reads_checked
    reads = agent.captured("reads", lambda _, t: {"x": t["x"] * float(t["x"].sum())})
    assert reads({}, {"x": np.ones(2, dtype=np.float32)})["x"].tolist() == [2.0, 2.0]
    with pytest.raises(HostReadError):
        reads({}, {"x": np.ones(2, dtype=np.float32)})
    clean = agent.captured("clean", lambda _, t: {"x": t["x"] * t["x"].sum()})
    assert clean({}, {"x": np.ones(2, dtype=np.float32)})["x"].tolist() == [2.0, 2.0]
    unchecked = GlamAgent.from_config(AgentConfig.of_run(run_config(tiny_models["tiny-t5"], "sac")), ACTION_VOCABULARY)
    assert unchecked.captured("reads", lambda _, t: {"x": t["x"] * float(t["x"].sum())})({}, {"x": np.ones(2)})


def test_an_uncaptured_unchecked_run_keeps_no_count_per_shape():
    """On a CPU without the host-read check every batch shape is a key: nothing is kept per key, so a long run's
    bookkeeping does not grow with the shapes it meets."""
    from types import SimpleNamespace

    from sacglam_core.agent.static import Graphs

    graphs = Graphs("cpu", enabled=False)
    for width in range(1, 200):
        out = graphs.run(
            ("score", width), lambda t: {"x": t["x"] * 2}, SimpleNamespace(tensors={"x": torch.ones(width)})
        )
        assert out["x"].shape == (width,)
    assert graphs._eager_calls == {}
