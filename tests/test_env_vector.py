"""The vector environment: lockstep, autoreset, determinism, state round trip."""

import random

import numpy as np
import pytest

from sacglam_core.envs import EnvConfig, InvalidActionError, VectorPlayground


def rollout(envs: VectorPlayground, steps: int, seed: int):
    rng = random.Random(seed)
    obs, infos = envs.reset(seed=seed)
    trace = [(obs, infos["goal"])]
    for _ in range(steps):
        actions = [rng.choice(a) for a in infos["possible_actions"]]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        trace.append((obs, actions, rewards.tolist(), terminated.tolist(), truncated.tolist(), infos["achieved_goals"]))
    return trace


def test_same_seed_same_trajectories_and_different_seed_differs():
    a = rollout(VectorPlayground(8, seed=None), 60, seed=42)
    b = rollout(VectorPlayground(8, seed=None), 60, seed=42)
    c = rollout(VectorPlayground(8, seed=None), 60, seed=43)
    assert a == b
    assert a != c


def test_environments_are_independent_and_autoreset():
    envs = VectorPlayground(32, EnvConfig(max_steps=5), seed=0)
    obs, infos = envs.reset()
    assert len(obs) == 32 and len(set(infos["goal"])) > 20
    rng = random.Random(0)
    finished = 0
    for _ in range(12):
        actions = [rng.choice(a) for a in infos["possible_actions"]]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        done = terminated | truncated
        finished += done.sum()
        for i in np.flatnonzero(done):
            assert infos["final_obs"][i] is not None
            assert infos["final_info"][i]["goal"]
            assert "You have grown" in obs[i] and obs[i].startswith("You see:")
            assert "You are holding: nothing" in obs[i]  # a fresh episode
        for i in np.flatnonzero(~done):
            assert infos["final_obs"][i] is None
    assert finished >= 64  # horizon 5: everybody finishes at least twice in 12 steps


def test_state_round_trip_continues_identically():
    envs = VectorPlayground(4, seed=1)
    rng = random.Random(1)
    _, infos = envs.reset()
    for _ in range(7):
        _, _, _, _, infos = envs.step([rng.choice(a) for a in infos["possible_actions"]])
    state = envs.state_dict()
    copy = VectorPlayground(4, seed=99)
    copy.load_state_dict(state)
    for _ in range(30):
        actions = [rng.choice(a) for a in infos["possible_actions"]]
        out_a, out_b = envs.step(actions), copy.step(actions)
        assert out_a[0] == out_b[0] and out_a[4]["achieved_goals"] == out_b[4]["achieved_goals"]
        np.testing.assert_array_equal(out_a[1], out_b[1])
        infos = out_a[4]


def test_bad_vector_input():
    envs = VectorPlayground(2, seed=0)
    _, infos = envs.reset()
    with pytest.raises(ValueError, match="3 actions for 2"):
        envs.step(["Grasp"] * 3)
    with pytest.raises(InvalidActionError, match="'Jump'"):
        envs.step(["Grasp", "Jump"])
    with pytest.raises(ValueError, match="num_envs"):
        VectorPlayground(0)


def test_an_invalid_action_steps_no_environment():
    envs = VectorPlayground(4, seed=0)
    _, infos = envs.reset()
    before = envs.state_dict()
    actions = [a[0] for a in infos["possible_actions"][:3]] + ["Jump"]
    with pytest.raises(InvalidActionError, match="environment 3: invalid action 'Jump'"):
        envs.step(actions)
    assert envs.state_dict() == before
