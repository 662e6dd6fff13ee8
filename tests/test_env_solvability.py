"""Every goal is solvable within the horizon: a scripted planner reaches reward 1."""

import pytest

from sacglam_core.envs import EnvConfig, PlaygroundText, catalog
from sacglam_core.envs.planner import planner_action


def solve(env: PlaygroundText, goal: str | None = None) -> tuple[float, int]:
    env.reset(options=None if goal is None else {"goal": goal})
    for step in range(1, env.config.max_steps + 1):
        _, reward, terminated, truncated, _ = env.step(planner_action(env))
        if terminated or truncated:
            return reward, step
    raise AssertionError("the episode did not end within the horizon")


@pytest.mark.parametrize(
    "config",
    [
        EnvConfig(),
        EnvConfig(grasp_rule="event"),
        EnvConfig(capacity=1),
        EnvConfig(split="test"),
        EnvConfig.simplified_variant(),
    ],
    ids=["train", "train-event", "capacity1", "test", "simplified"],
)
def test_every_goal_is_solved_in_a_sweep(config):
    env = PlaygroundText(config, seed=11)
    goals = catalog().goals(config.split, config.simplified)
    failures = [g for g in goals if solve(env, g)[0] != 1.0]
    assert not failures, failures[:5]


@pytest.mark.parametrize("seed", range(3))
def test_sampled_goals_are_solved_across_seeds(seed):
    env = PlaygroundText(seed=seed)
    results = [solve(env) for _ in range(1000)]
    assert all(reward == 1.0 for reward, _ in results)
    assert max(steps for _, steps in results) <= 7
