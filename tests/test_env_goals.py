"""The goal language: exact counts, split rules and the command line."""

import subprocess
import sys

import pytest

from sacglam_core.envs import GoalType, UnknownGoalError, catalog
from sacglam_core.envs.__main__ import goal_type_counts
from sacglam_core.envs.objects import KINDS


def test_simple_goal_counts():
    goals = catalog()
    assert len(goals.goals("train", simplified=True)) == 182
    assert len(goals.goals("test", simplified=True)) == 64
    train = goal_type_counts("train", simplified=True)
    assert (train[GoalType.GRASP], train[GoalType.GROW]) == (136, 46)


def test_sequential_goal_counts():
    train, test = goal_type_counts("train"), goal_type_counts("test")
    assert train[GoalType.GROW_THEN_GRASP] == 6218
    assert train[GoalType.GROW_THEN_GROW] == 2070
    assert sum(train.values()) == 8470
    assert sum(test.values()) == 3145
    assert test[GoalType.GROW_THEN_GRASP] + test[GoalType.GROW_THEN_GROW] == 3081
    sequential_share = 1 - 182 / 8470
    assert round(100 * sequential_share, 2) == 97.85


def test_goals_are_unique_and_splits_disjoint():
    train, test = catalog().goals("train"), catalog().goals("test")
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)


@pytest.mark.parametrize(
    "goal, split",
    [
        ("Grasp red tree", "test"),
        ("Grasp any flower", "test"),
        ("Grasp green animal", "test"),
        ("Grasp any fly", "test"),
        ("Grow blue plant", "test"),
        ("Grow any living_thing", "test"),
        ("Grow green dog", "test"),
        ("Grasp blue tree", "train"),
        ("Grow red fly", "train"),
        ("Grow any animal", "train"),
        ("Grasp any living_thing", "train"),
        ("Grow blue cat then grasp any red thing", "train"),
        ("Grow any plant then grasp red tree", "test"),
    ],
)
def test_split_rules(goal, split):
    assert catalog().parse(goal).split == split


def test_no_grow_goal_for_furniture_or_supply_and_no_same_object_sequence():
    goals = catalog()
    for text in ("Grow red chair", "Grow any supply", "Grow blue water", "Grow any furniture"):
        assert text not in goals
    assert "Grow red dog then grasp red dog" not in goals
    assert "Grow any dog then grow any dog" not in goals
    assert "Grow red dog then grasp any dog" in goals
    # the paper's Figure 3 goal mixes a train Grow with a test Grow: no split holds it
    assert "Grow green mouse then grow blue rose" not in goals


def test_goal_semantics():
    goals = catalog()
    living = goals.parse("Grasp any living_thing").parts[0]
    assert {KINDS[i].category for i in living.matches} == {"animal", "plant"}
    any_red = goals.parse("Grow any red thing").parts[0]
    assert all(KINDS[i].color == "red" and KINDS[i].is_living for i in any_red.matches)
    assert len(goals.parse("Grasp any red thing").parts[0].matches) == 32
    assert [KINDS[i].name for i in goals.parse("Grasp green dog").parts[0].matches] == ["green dog"]


def test_unknown_goal_is_rejected_with_its_name():
    with pytest.raises(UnknownGoalError, match="'Grasp purple dog'"):
        catalog().parse("Grasp purple dog")


def test_cli_goals_and_stats():
    run = lambda *args: (
        subprocess.run(  # noqa: E731
            [sys.executable, "-m", "sacglam_core.envs", *args], capture_output=True, text=True, check=True
        ).stdout
    )
    assert run("goals", "--split", "train").splitlines() == catalog().goals("train")
    assert len(run("goals", "--split", "test", "--simplified").splitlines()) == 64
    stats = run("stats")
    assert "8470" in stats and "3145" in stats and "97.85%" in stats
    chance = {rule: run("random", "--grasp-rule", rule, "--episodes", "1000") for rule in ("holding", "event")}
    rates = {rule: dict(line.rsplit(None, 1) for line in text.splitlines()) for rule, text in chance.items()}
    assert list(rates["holding"]) == [t.value for t in GoalType]
    # holding a matching object when the first part is reached counts only under the holding rule
    grow_then_grasp = {rule: float(r["grow then grasp"].rstrip("%")) for rule, r in rates.items()}
    assert grow_then_grasp["holding"] > grow_then_grasp["event"]
    bad = subprocess.run(
        [sys.executable, "-m", "sacglam_core.envs", "goals", "--split", "dev"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "invalid choice: 'dev'" in bad.stderr
