"""The world's rules on hand-built scenes: actions, capacity, growth, completion, observation text."""

import pytest

from sacglam_core.envs import EnvConfig, InvalidActionError, PlaygroundText, UnknownGoalError, catalog, prompt

SCENE = ["green water", "green mouse", "blue rose", "red rose", "blue lion", "red food"]


def make(goal="Grow green mouse then grow blue lion", scene=SCENE, **config):
    env = PlaygroundText(EnvConfig(**config), seed=0)
    obs, info = env.reset(options={"goal": goal, "scene": scene})
    return env, obs, info


def test_observation_text_matches_the_paper():
    env, obs, info = make()
    assert prompt(info["goal"], obs) == (
        "Goal: Grow green mouse then grow blue lion\n"
        "You see: green water, green mouse, blue rose, red rose, blue lion, red food\n"
        "You are on: nothing\n"
        "You are holding: nothing\n"
        "You have grown: nothing\n"
        "Action:"
    )


def test_candidate_actions_follow_the_state():
    env, _, info = make()
    assert info["possible_actions"] == [f"Go to {o}" for o in SCENE] + ["Grasp"]
    env.step("Go to green water")
    env.step("Grasp")
    env.step("Go to red food")
    obs, _, _, _, info = env.step("Grasp")
    assert "Go to green water" not in info["possible_actions"]
    assert info["possible_actions"][-3:] == ["Release green water", "Release red food", "Release all"]
    assert "You are holding: green water, red food" in obs
    assert "You see: green mouse, blue rose, red rose, blue lion\n" in obs


def test_capacity_limits_grasp_and_is_configurable():
    env, _, _ = make(capacity=1)
    env.step("Go to green water")
    env.step("Grasp")
    env.step("Go to red food")
    obs, _, _, _, info = env.step("Grasp")  # a no-op: the hand is full
    assert "You are holding: green water\n" in obs and "You are on: red food" in obs
    assert "Release all" not in info["possible_actions"]


def test_water_grows_plants_and_animals_food_only_animals():
    env, _, _ = make(goal="Grasp red rose")
    env.step("Go to red food")
    env.step("Grasp")
    obs, *_ = env.step("Go to red rose")
    assert "You have grown: nothing" in obs
    obs, _, _, _, info = env.step("Go to blue lion")
    assert "You have grown: blue lion" in obs
    assert "Grow blue lion" in info["achieved_goals"]


def test_sequential_goal_needs_first_part_first():
    env, _, _ = make()
    # growing the lion first does not count for "... then grow blue lion"
    for action in ("Go to green water", "Grasp", "Go to blue lion"):
        _, reward, terminated, _, _ = env.step(action)
    assert reward == 0 and not terminated
    _, reward, terminated, _, info = env.step("Go to green mouse")  # first part now
    assert reward == 0 and not terminated and "Grow green mouse" in info["achieved_goals"]
    _, reward, terminated, truncated, info = env.step("Go to blue lion")  # the lion grows again
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert "Grow green mouse then grow blue lion" in info["achieved_goals"]


def test_same_step_counts_for_both_parts():
    env, _, _ = make(goal="Grow any animal then grow green mouse")
    env.step("Go to green water")
    env.step("Grasp")
    _, reward, terminated, _, _ = env.step("Go to green mouse")
    assert reward == 1.0 and terminated


def test_released_objects_stay_where_the_agent_is_and_meet_again():
    env, _, _ = make(goal="Grasp blue lion")
    env.step("Go to green water")
    env.step("Grasp")
    env.step("Go to red rose")  # rose grows
    obs, *_ = env.step("Release green water")
    assert "You are on: green water" in obs
    env.step("Go to blue lion")
    obs, _, _, _, info = env.step("Go to red rose")  # rose meets the water left beside it
    assert info["achieved_goals"] == []  # already reported once this episode
    assert obs.endswith("You have grown: red rose")


def test_horizon_truncates_and_is_configurable():
    env, _, _ = make(goal="Grasp blue lion", max_steps=3)
    for _ in range(2):
        _, _, terminated, truncated, _ = env.step("Go to red rose")
        assert not (terminated or truncated)
    _, reward, terminated, truncated, _ = env.step("Go to red rose")
    assert (reward, terminated, truncated) == (0.0, False, True)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Grasp")


def test_invalid_action_names_the_action_and_the_valid_ones():
    env, _, _ = make()
    with pytest.raises(InvalidActionError) as error:
        env.step("Release green water")
    message = str(error.value)
    assert "'Release green water'" in message and "'Go to green water'" in message and "'Grasp'" in message
    with pytest.raises(InvalidActionError, match="'Fly away'"):
        env.step("Fly away")


def test_unknown_goal_and_bad_scene_are_rejected():
    env = PlaygroundText(seed=0)
    with pytest.raises(UnknownGoalError, match="'Grow red chair'"):
        env.reset(options={"goal": "Grow red chair"})
    with pytest.raises(ValueError, match="purple cow"):
        env.reset(options={"goal": "Grasp red dog", "scene": ["purple cow"] * 6})


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="n_objects=3"):
        EnvConfig(n_objects=3)
    with pytest.raises(ValueError, match="split"):
        EnvConfig(split="dev")
    with pytest.raises(ValueError, match="max_steps"):
        EnvConfig(max_steps="many")
    with pytest.raises(ValueError, match="colour"):
        EnvConfig(colour="red")
    with pytest.raises(ValueError, match="capacity"):
        EnvConfig(capacity=0)


@pytest.mark.parametrize("simplified", [False, True])
def test_scene_sampling_places_what_the_goal_needs(simplified):
    config = EnvConfig.simplified_variant() if simplified else EnvConfig()
    env = PlaygroundText(config, seed=3)
    goals = catalog()
    for _ in range(500):
        _, info = env.reset()
        assert len(env.kinds) == config.n_objects
        goal = goals.parse(info["goal"])
        kinds = {k.index for k in env.kinds}
        for part in goal.parts:
            targets = [k for k in env.kinds if k.index in part.matches]
            assert targets, (info["goal"], env.kinds)
            if part.verb == "grow":
                assert any(t.grows_with(s) for t in targets for s in env.kinds), info["goal"]
        assert kinds


def test_goals_are_sampled_from_the_configured_split():
    env = PlaygroundText(EnvConfig(split="test"), seed=0)
    test_goals = set(catalog().goals("test"))
    assert all(env.reset()[1]["goal"] in test_goals for _ in range(200))
    simplified = PlaygroundText(EnvConfig.simplified_variant(), seed=0)
    simple = set(catalog().goals("train", simplified=True))
    assert all(simplified.reset()[1]["goal"] in simple for _ in range(200))
