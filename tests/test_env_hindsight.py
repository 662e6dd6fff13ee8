"""Hindsight soundness: the social partner's reports agree with the reward function."""

import random
from dataclasses import asdict

import pytest

from sacglam_core.envs import EnvConfig, GoalType, PlaygroundText, catalog


def random_trajectory(env: PlaygroundText, rng: random.Random):
    obs, info = env.reset()
    scene = [k.name for k in env.kinds]
    actions, reports = [], []
    done = False
    while not done:
        action = rng.choice(info["possible_actions"])
        _, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        reports.append(info["achieved_goals"])
        done = terminated or truncated
    return scene, actions, reports


def replay_rewards(config: EnvConfig, goal: str, scene: list[str], actions: list[str]) -> list[float]:
    env = PlaygroundText(config)
    env.reset(options={"goal": goal, "scene": scene})
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    return rewards


@pytest.mark.parametrize("grasp_rule", ["holding", "event"])
@pytest.mark.parametrize(
    "config", [EnvConfig(max_steps=30), EnvConfig.simplified_variant()], ids=["full", "simplified"]
)
def test_reported_goals_give_reward_exactly_when_reported(config, grasp_rule):
    config = EnvConfig(**{**asdict(config), "grasp_rule": grasp_rule})
    env = PlaygroundText(config, seed=5)
    rng = random.Random(5)
    train = set(catalog().goals("train"))
    checked = set()
    for _ in range(300):
        scene, actions, reports = random_trajectory(env, rng)
        seen = [g for step in reports for g in step]
        assert len(seen) == len(set(seen)), "a goal was reported twice in one episode"
        for t, goals in enumerate(reports):
            for goal in goals:
                assert goal in train
                rewards = replay_rewards(config, goal, scene, actions)
                assert rewards == [0.0] * t + [1.0], (goal, t, rewards)
                checked.add(catalog().parse(goal).type)
    expected = {GoalType.GRASP, GoalType.GROW} if config.simplified else set(GoalType)
    assert checked == expected


def test_sequential_reports_need_the_first_part_earlier_or_now():
    env = PlaygroundText(seed=0)
    env.reset(
        options={
            "goal": "Grasp red dog",
            "scene": ["red water", "blue cat", "red dog", "red sofa", "blue door", "green dog"],
        }
    )
    reports = [
        env.step(a)[4]["achieved_goals"] for a in ("Go to red water", "Grasp", "Go to red dog", "Go to blue cat")
    ]
    assert "Grasp red water" in reports[1]
    assert "Grow red dog" in reports[2]
    assert "Grow red dog then grow blue cat" not in reports[2]
    assert "Grow red dog then grow blue cat" in reports[3]
    assert "Grow any animal then grow blue cat" in reports[3]
    assert "Grow blue cat then grow red dog" not in [g for r in reports for g in r]


def test_partner_of_the_simplified_variant_reports_simple_goals_only():
    env = PlaygroundText(EnvConfig.simplified_variant(), seed=0)
    env.reset(options={"goal": "Grasp red dog", "scene": ["red water", "blue cat", "red dog"]})
    reports = [
        g
        for a in ("Go to red water", "Grasp", "Go to red dog", "Go to blue cat")
        for g in env.step(a)[4]["achieved_goals"]
    ]
    assert "Grow blue cat" in reports
    assert all(" then " not in g for g in reports)


def test_default_grasp_rule_is_the_originals_holding():
    """playground_env's get_reward_from_state (and the text wrapper's reward) rewards Grasp goals on the
    grasped flag of the current state: while a matching object is held."""
    assert EnvConfig().grasp_rule == "holding"


@pytest.mark.parametrize("grasp_rule, rewarded", [("holding", True), ("event", False)])
def test_grow_then_grasp_with_the_object_already_held(grasp_rule, rewarded):
    """The dog grows while the agent holds the red water that grew it: under the holding rule
    "Grow red dog then grasp red water" is reached on that step (and reported there); under the event
    rule it needs a fresh Grasp of red water afterwards."""
    goal = "Grow red dog then grasp red water"
    env = PlaygroundText(EnvConfig(grasp_rule=grasp_rule), seed=0)
    scene = ["red water", "blue cat", "red dog", "red sofa", "blue door", "green dog"]
    env.reset(options={"goal": goal, "scene": scene})
    env.step("Go to red water")
    env.step("Grasp")
    _, reward, terminated, _, info = env.step("Go to red dog")
    assert "Grow red dog" in info["achieved_goals"]
    assert (reward == 1.0, terminated, goal in info["achieved_goals"]) == (rewarded, rewarded, rewarded)
    if not rewarded:
        env.step("Release red water")
        _, reward, terminated, _, info = env.step("Grasp")
        assert reward == 1.0 and terminated and goal in info["achieved_goals"]
