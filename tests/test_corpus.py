"""The pre-training corpus teaches language, not the task: its leakage rules, checked on every line."""

import re

import pytest

from sacglam_core.envs import catalog
from sacglam_core.envs.objects import COLORS, NAMES
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.tiny.corpus import DOMAINS, corpus

# The environment's observation lines. `goal:` and `action:` alone are words of many instruction formats: the
# selection tasks use them, about other domains' objects only (checked below).
PROMPT_MARKERS = ("you see:", "you are on:", "you are holding:", "you have grown:")
NAME = "|".join(sorted(NAMES, key=len, reverse=True))
COLOR = "|".join(COLORS)
# An action or goal phrase naming an environment object, type or category, with or without its colour.
ENV_PHRASE = re.compile(rf"\b(?:go to|release|grasp|grow)(?: the| a| an| any)?(?: \w+)? (?:{NAME})\b")
ANY_COLOR_THING = re.compile(rf"\b(?:grasp|grow) any (?:{COLOR}) thing\b")


@pytest.fixture(scope="module")
def lines():
    return corpus()


def leaks(line: str) -> list[str]:
    text = line.lower()
    found = [m for m in PROMPT_MARKERS if m in text]
    return found + [m.group(0) for m in (*ENV_PHRASE.finditer(text), *ANY_COLOR_THING.finditer(text))]


def test_the_rules_catch_every_goal_and_action_of_the_environment():
    goals = catalog()
    for text in goals.goals("train") + goals.goals("test"):
        assert leaks(text), text
    for action in ACTION_VOCABULARY:
        if action not in ("Grasp", "Release all"):  # no object: these words alone are the verbs' definitions
            assert leaks(action), action
    assert leaks("Goal: Grow red cat\nYou see: red cat, red water\nAction:")


def test_no_line_holds_a_prompt_an_environment_action_or_a_goal(lines):
    leaking = {line: leaks(line) for line in lines if leaks(line)}
    assert not leaking, list(leaking.items())[:5]


def test_selection_tasks_name_no_environment_object_and_answer_with_what_they_show(lines):
    assert not {o for objects in DOMAINS.values() for o in objects} & set(NAMES)
    tasks = [line for line in lines if "goal:" in line or "action:" in line]
    assert len(tasks) > 1000
    for line in tasks:
        assert not set(re.findall(r"\w+", line)) & set(NAMES), line
    moves = [line.rsplit(": ", 1) for line in tasks]
    for context, move in moves:
        words = set(re.findall(r"\w+", move)) - {"go", "to", "release", "grasp"}
        assert words <= set(re.findall(r"\w+", context)), move  # names a thing the line shows, no other


def test_the_corpus_is_the_same_in_every_process():
    assert corpus() == corpus() and corpus(1) != corpus()
