"""SAC-GLAM and PPO-GLAM updates on the tiny model: the critic warm-up and the optimizer steps."""

import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.static import stage
from sacglam_core.algos.ppo import PPO, value_loss
from sacglam_core.algos.sac import ACTOR_LOSSES, SAC
from sacglam_core.config import SACConfig, parse_config
from sacglam_core.distributed import Ranks
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import goal_type_prior
from sacglam_core.trajectories import EpisodeRecorder

TINY_ENV = {"n_objects": 3, "simplified": True, "max_steps": 8}


def run_config(model, algorithm: str, model_options: dict | None = None, **settings):
    model = {"name_or_path": str(model), **(model_options or {})}
    return parse_config({"algorithm": algorithm, "model": model, "num_envs": 8, "env": TINY_ENV, **settings})


def rollout(agent: GlamAgent, config, steps: int = 64, algo=None) -> tuple[list, EpisodeRecorder]:
    """Finished episodes, recorded as the trainer records them, of `algo` acting (or the random policy)."""
    envs = VectorPlayground(config.num_envs, config.env, seed=0)
    recorder = EpisodeRecorder(agent.tokens)
    obs, infos = envs.reset()
    recorder.reset(infos["goal"], obs, infos["possible_actions"])
    rng, generator, episodes = random.Random(0), torch.Generator().manual_seed(0), []
    for _ in range(steps // config.num_envs):
        candidates = recorder.candidates()
        if algo is None:
            choices, extras = [rng.randrange(len(c)) for c in candidates], {}
        else:
            tokens = [[agent.tokens.action(ACTION_VOCABULARY[a]) for a in c] for c in candidates]
            batch = agent.collate(recorder.prompts(), tokens, [c.tolist() for c in candidates])
            choices, extras = algo.act(batch, [generator])
        obs, rewards, terminated, truncated, infos = envs.step(
            [ACTION_VOCABULARY[c[k]] for c, k in zip(candidates, choices)]
        )
        episodes += recorder.step(choices, rewards, terminated, truncated, obs, infos, extras)
    return episodes, recorder


def sac_on_tiny(model, model_options: dict | None = None, **sac):
    critic = {"input": "decoded_action", "hidden_units": 32}
    config = run_config(model, "sac", model_options, sac={"batch_size": 8, "critic": critic, **sac})
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig(config.model, critic=config.sac.critic), ACTION_VOCABULARY)
    algo = SAC(agent, config, Ranks(), goal_type_prior(config.env))
    for episode in rollout(agent, config)[0]:
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


def test_actor_learning_rate_ramps_up_after_the_warmup_and_resumes_where_it_was(tiny_models):
    """With actor_lr_ramp_updates N the k-th actor update (from 1) steps at actor_lr * k / N, then at actor_lr;
    the warm-up's critic-only updates do not count, and a checkpoint carries the ramp's position."""
    ramped = {"warmup_cycles": 1, "updates_per_cycle": 1, "actor_lr": 1e-3, "actor_lr_ramp_updates": 4}
    algo = sac_on_tiny(tiny_models["tiny-t5"], **ramped)
    lrs = []
    step = algo._step

    def record(optimizer, *args, **kwargs):
        if optimizer is algo.actor_optimizer:
            lrs.append(optimizer.param_groups[0]["lr"])
        return step(optimizer, *args, **kwargs)

    algo._step = record
    for cycle in range(4):
        algo.update(None, env_steps=10_000 * (cycle + 1))
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4])  # cycle 0 is the warm-up
    resumed = sac_on_tiny(tiny_models["tiny-t5"], **ramped)
    resumed.load_state_dict(algo.state_dict())
    algo.update(None, env_steps=50_000)
    assert lrs[-1] == pytest.approx(1e-3)
    assert resumed.actor_optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert SACConfig().actor_lr_ramp_updates == 0  # the paper has no ramp


@pytest.mark.parametrize("name", ["reverse_kl", "forward_kl"])
def test_the_configured_actor_loss_is_the_one_stepped_and_logged(tiny_models, monkeypatch, name):
    losses, loss = [], ACTOR_LOSSES[name]

    def spy(*args):
        losses.append(loss(*args))
        return losses[-1]

    monkeypatch.setitem(ACTOR_LOSSES, name, spy)
    algo = sac_on_tiny(tiny_models["tiny-t5"], warmup_cycles=0, updates_per_cycle=1, actor_loss=name)
    algo.update(None, env_steps=10_000)
    assert len(losses) == 1 and algo.pop_stats()["actor_loss"] == pytest.approx(losses[0].item())


def test_ppo_value_loss_is_clipped_around_the_rollouts_values(tiny_models):
    config = run_config(tiny_models["tiny-causal"], "ppo", ppo={"rollout_steps": 64, "minibatch_size": 64})
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig(config.model, value_head=True), ACTION_VOCABULARY)
    algo = PPO(agent, config, Ranks())
    episodes, recorder = rollout(agent, config, algo=algo)
    segments = episodes + recorder.cut()
    (data,) = algo._transitions([segments])
    assert [t.old_value for t in data] == pytest.approx([v for s in segments for v in s.extras["value"]])
    with torch.no_grad():  # pretend the value head moved far since the rollout: the clip must bind
        agent.value_head.head[-1].bias += 1.0
        batch = agent.batch_from_ids(
            [t.prompt for t in data],
            [[agent.tokens.action(ACTION_VOCABULARY[a]) for a in t.candidates] for t in data],
            [list(t.candidates) for t in data],
        )
        values = agent.value(agent.policy(batch, hidden=True)[1])
    old, returns = torch.tensor([t.old_value for t in data]), torch.tensor([t.ret for t in data])
    algo._minibatch_step([data])
    logged = algo.pop_stats()["value_loss"]
    assert logged == pytest.approx(value_loss(values, old, returns, clip=0.2).item(), rel=1e-5)
    assert logged != pytest.approx(value_loss(values, old, returns, clip=None).item(), rel=1e-3)


FP16_LORA = {"dtype": "float16", "lora": {"r": 4}}


@pytest.mark.parametrize("model_options, scaled", [(FP16_LORA, True), ({}, False)], ids=["fp16", "fp32"])
def test_fp16_updates_scale_the_loss_of_fp32_trained_weights(tiny_models, model_options, scaled):
    algo = sac_on_tiny(tiny_models["tiny-t5"], model_options, warmup_cycles=0)
    trained = algo.actor_params + algo.critic_params
    assert all(p.dtype == torch.float32 for p in trained)  # LoRA adapters and heads: the scaler unscales them
    assert any(p.dtype == torch.float16 for p in algo.agent.lm.model.parameters()) == scaled
    before = [p.detach().clone() for p in trained]
    algo.update(None, env_steps=10_000)
    stats = algo.pop_stats()
    assert all(math.isfinite(stats[k]) for k in ("critic_loss", "actor_loss", "mean_q", "entropy"))
    assert all(not torch.equal(a, p) for a, p in zip(before, trained) if p.grad is not None)
    scalers = algo.state_dict()["scalers"]
    assert len(scalers) == 3 and all(bool(s) == scaled for s in scalers)  # a disabled scaler has no state
    if scaled:
        assert algo.scalers[algo.critic_optimizer].get_scale() > 1  # losses are multiplied before backward

    ppo_config = run_config(tiny_models["tiny-causal"], "ppo", model_options, ppo={"rollout_steps": 32})
    agent = GlamAgent.from_config(AgentConfig(ppo_config.model, value_head=True), ACTION_VOCABULARY)
    ppo = PPO(agent, ppo_config, Ranks())
    assert ppo.scaler.is_enabled() == scaled and bool(ppo.state_dict()["scaler"]) == scaled


@pytest.mark.parametrize("every, warmup", [(1, 0), (1, 5), (0, 0)], ids=["actor", "warm-up", "off"])
def test_the_policy_kl_of_an_update_is_measured_on_its_batch_and_changes_nothing(tiny_models, every, warmup):
    """The whole update's change of pi on its batch: in the warm-up the critic alone moves the policy, through the
    weights it shares with it."""
    import copy

    def trained(every: int):
        algo = sac_on_tiny(tiny_models["tiny-t5"], warmup_cycles=warmup, updates_per_cycle=1)
        algo.config = dataclasses.replace(
            algo.config, monitor=dataclasses.replace(algo.config.monitor, policy_kl_every=every)
        )
        before, batches, sample = copy.deepcopy(algo.agent), [], algo._batches
        algo._batches = lambda index: batches.append(sample(index)) or batches[-1]
        algo.update(None, env_steps=10_000)
        current = batches[0][0]["current"]
        return algo, before, current.on(stage(current.arrays, "cpu").tensors)

    algo, before, current = trained(every)
    plain, _, _ = trained(0)
    assert all(torch.equal(a, b) for a, b in zip(algo.agent.lm.model.parameters(), plain.agent.lm.model.parameters()))
    stats = algo.pop_stats()
    assert ("actor_loss" in stats) == (warmup == 0)
    if not every:
        assert "policy_kl" not in stats
        return
    with torch.no_grad():
        expected = before.policy(current)[0].kl(algo.agent.policy(current)[0]).mean().item()
    assert expected > 0 and stats["policy_kl"] == pytest.approx(expected, rel=1e-5)


def test_ppo_measures_the_kl_of_an_update_on_the_rollouts_own_states(tiny_models):
    config = run_config(
        tiny_models["tiny-causal"],
        "ppo",
        ppo={"rollout_steps": 64, "minibatch_size": 32, "epochs": 2},
        her={"enabled": True},
    )
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig(config.model, value_head=True), ACTION_VOCABULARY)
    algo = PPO(agent, config, Ranks())
    episodes, recorder = rollout(agent, config, algo=algo)
    for episode in episodes:
        algo.add(episode)
    own = [s for s in algo.segments[0] + recorder.cut()]
    algo.segments = [own]
    algo.update([EpisodeRecorder(agent.tokens)], env_steps=64)
    states = [(t.prompt, t.candidates, t.old_log_probs) for t in algo._transitions([own])[0] if not t.relabelled]
    assert len(states) == sum(s.length for s in own) < len(algo._transitions([own])[0])  # hindsight copies left out
    with torch.no_grad():
        batch = agent.batch_from_ids(
            [p for p, _, _ in states],
            [[agent.tokens.action(ACTION_VOCABULARY[a]) for a in c] for _, c, _ in states],
            [list(c) for _, c, _ in states],
        )
        after = agent.policy(batch)[0]
    before = after.log_probs.new_zeros(after.log_probs.shape)
    for row, (_, _, log_probs) in enumerate(states):
        before[row, : len(log_probs)] = torch.as_tensor(log_probs)
    expected = (before.exp() * after.mask * (before - after.log_probs)).sum(1).mean().item()
    assert expected > 0 and algo.pop_stats()["policy_kl"] == pytest.approx(expected, rel=1e-4)


def test_with_static_shapes_an_update_is_one_graph_measured_or_not_whatever_share_bootstraps(tiny_models):
    """A GPU replays each kind of call in its shapes from a graph of its own (with `model.compile`, a compilation):
    the update keeps one key whether the policy's KL is measured or not, its s_{t+n} rows fill the batch whatever
    the share that bootstraps, and acting batches pad their rows to a power of two, dropped after the pass."""
    config = run_config(
        tiny_models["tiny-t5"], "sac", sac={"batch_size": 8, "warmup_cycles": 0, "updates_per_cycle": 1}
    )
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, static_shapes=True),
        monitor=dataclasses.replace(config.monitor, policy_kl_every=2),
    )
    torch.manual_seed(0)
    agent = GlamAgent.from_config(AgentConfig.of_run(config), ACTION_VOCABULARY)
    algo = SAC(agent, config, Ranks(), goal_type_prior(config.env))
    for episode in rollout(agent, config)[0]:
        algo.add(episode)
    keys, rows = [], []
    run = agent.graphs.run

    def spy(key, fn, inputs):
        keys.append(key)
        rows.append(next(iter(inputs.tensors.values())).shape[0])
        return run(key, fn, inputs)

    agent.graphs.run = spy
    sample, following = algo._batches, []

    def recorded(index):
        batches = sample(index)
        following.append(batches[0]["following"])
        return batches

    algo._batches = recorded
    for _ in range(4):
        algo.update(None, env_steps=10_000)
    assert {len(batch.prompt_tokens) for batch in following} == {8}
    assert len({key for key in keys if key[0] == "sac"}) == 1
    assert "policy_kl" in algo.pop_stats()

    host = agent.collate([[3, 4, 5]] * 5, [[[6], [7, 8]]] * 5)
    rows.clear()
    policy = agent.acting_policy(host)
    assert rows == [8] and policy.log_probs.shape[0] == 5
    agent.lm.shapes = type(agent.lm.shapes)()  # each batch's own shapes, as on a CPU
    plain = agent.acting_policy(agent.collate([[3, 4, 5]] * 5, [[[6], [7, 8]]] * 5))
    torch.testing.assert_close(policy.log_probs[:, :2], plain.log_probs)


def test_a_padded_s_t_plus_n_batch_gives_the_unpadded_critic_loss_whatever_the_copies_discount(tiny_models):
    """The rows that bootstrap come first and, with static shapes, their s_{t+n} batch is padded with copies of its
    first row up to the whole batch. The copies are not `real`: their next values read 0 even where the rows they
    stand beside carried a discount (0.5 here, where an episode's end makes it 0), so the padded batch gives the
    unpadded critic loss."""
    losses = []
    for pad in (False, True):
        algo = sac_on_tiny(tiny_models["tiny-t5"], warmup_cycles=0)
        batches, arrays = algo._batches([np.arange(8)])
        arrays.pop("rank")
        following = batches["following"]
        assert 0 < len(following.prompt_tokens) < 8, "the test needs rows that bootstrap and rows that do not"
        if pad:
            batches["following"] = following.padded(8)
        arrays["discount"] = np.where(arrays["discount"] > 0, arrays["discount"], 0.5).astype(np.float32)
        arrays["env_steps"] = np.zeros((), dtype=np.float64)
        alpha = algo.log_alpha.exp().detach()

        def critic(b, t, algo=algo, alpha=alpha):
            return algo._critic_update(
                b["taken"], b.get("following"), t["reward"], t["discount"], alpha, t["env_steps"]
            )

        losses.append(float(algo.agent.captured("sac-critic", critic)(batches, arrays)["critic_loss"]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_a_padded_ppo_minibatch_gives_the_unpadded_losses(tiny_models):
    """With static shapes a PPO minibatch of 13 rows is padded to 16 with copies that are not `real`: the losses
    (means over the real rows, advantages normalised over them) are those of the same rows unpadded."""
    algos = []
    for static in (False, True):
        config = run_config(
            tiny_models["tiny-causal"],
            "ppo",
            {"static_shapes": static},
            ppo={"rollout_steps": 64, "minibatch_size": 32, "epochs": 1, "normalize_advantages": True},
        )
        torch.manual_seed(0)
        algos.append(PPO(GlamAgent.from_config(AgentConfig.of_run(config), ACTION_VOCABULARY), config, Ranks()))
    plain, padded = algos
    padded.agent.load_mutable_state_dict(plain.agent.mutable_state_dict())
    episodes, recorder = rollout(plain.agent, plain.config, algo=plain)
    rows = plain._transitions([episodes + recorder.cut()])[0][:13]
    stats = []
    for algo in algos:
        algo._minibatch_step([rows])
        stats.append(algo.pop_stats())
    for name in ("policy_loss", "value_loss", "entropy"):
        assert stats[1][name] == pytest.approx(stats[0][name], rel=1e-5, abs=1e-6), name  # policy loss: about 0
