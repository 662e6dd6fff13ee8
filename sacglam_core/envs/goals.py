"""The goal language of Playground-Text: simple and sequential goals, their split and their meaning."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

from sacglam_core.envs.objects import CATEGORIES, COLORS, KINDS, NAMES


class UnknownGoalError(ValueError):
    """A goal string that is not in the goal language."""


class GoalType(enum.StrEnum):
    GRASP = "grasp"
    GROW = "grow"
    GROW_THEN_GRASP = "grow then grasp"
    GROW_THEN_GROW = "grow then grow"


@dataclass(frozen=True)
class SimpleGoal:
    """`Grasp|Grow <color|any> <name|thing>`; `matches` holds the kinds it describes, sorted.

    For Grow goals only living kinds match, since nothing else can grow.
    """

    index: int
    text: str
    verb: str  # "grasp" or "grow"
    matches: tuple[int, ...]


@dataclass(frozen=True)
class Goal:
    """A goal: one simple goal, or `first then second` (first is a Grow goal)."""

    text: str
    parts: tuple[SimpleGoal, ...]
    split: str

    @property
    def type(self) -> GoalType:
        if len(self.parts) == 1:
            return GoalType(self.parts[0].verb)
        return GoalType(f"grow then {self.parts[1].verb}")


def _is_test(text: str) -> bool:
    qualifiers = (*COLORS, "any")
    plant_names = (*CATEGORIES["plant"], "plant", "living_thing")
    substrings = ["red tree", "green dog", "blue door", "flower"]
    substrings += [f"Grasp {c} {n}" for c in qualifiers for n in ("animal", "fly")]
    substrings += [f"Grow {c} {p}" for c in qualifiers for p in plant_names]
    return any(s in text for s in substrings)


def _simple_goals() -> list[SimpleGoal]:
    goals: list[SimpleGoal] = []

    def add(verb: str, qualifier: str, color: str | None, name: str | None) -> None:
        if verb == "grow" and name in (*CATEGORIES["furniture"], *CATEGORIES["supply"], "furniture", "supply"):
            return
        matches = tuple(
            k.index
            for k in KINDS
            if (color is None or k.color == color)
            and (name is None or k.has_name(name))
            and (verb == "grasp" or k.is_living)
        )
        goals.append(SimpleGoal(len(goals), f"{verb.capitalize()} {qualifier}", verb, matches))

    for verb in ("grasp", "grow"):
        for color in COLORS:
            for name in NAMES:
                add(verb, f"{color} {name}", color, name)
        for color in COLORS:
            add(verb, f"any {color} thing", color, None)
        for name in NAMES:
            add(verb, f"any {name}", None, name)
    return goals


def _ends_alike(a: str, b: str) -> bool:
    return a.split()[-2:] == b.split()[-2:]


def sequential_text(first: str, second: str) -> str:
    return f"{first} then {second[0].lower()}{second[1:]}"


class GoalCatalog:
    """Every goal of both splits, with fast look-ups for the environment and the social partner."""

    def __init__(self) -> None:
        self.simple: tuple[SimpleGoal, ...] = tuple(_simple_goals())
        self._goals: dict[str, Goal] = {}
        self.by_split: dict[str, list[str]] = {"train": [], "test": []}
        self.simple_by_split: dict[str, list[str]] = {"train": [], "test": []}
        # (first.index, second.index) -> sequential goal text, per split.
        self.sequential: dict[str, dict[tuple[int, int], str]] = {"train": {}, "test": {}}
        for goal in self.simple:
            split = "test" if _is_test(goal.text) else "train"
            self._goals[goal.text] = Goal(goal.text, (goal,), split)
            self.simple_by_split[split].append(goal.text)
            self.by_split[split].append(goal.text)
        for split, simple_texts in self.simple_by_split.items():
            simple = [self._goals[t].parts[0] for t in simple_texts]
            for first in simple:
                if first.verb != "grow":
                    continue
                for second in simple:
                    if _ends_alike(first.text, second.text):
                        continue
                    text = sequential_text(first.text, second.text)
                    self._goals[text] = Goal(text, (first, second), split)
                    self.sequential[split][(first.index, second.index)] = text
                    self.by_split[split].append(text)

    def goals(self, split: str, simplified: bool = False) -> list[str]:
        """The goal strings of a split; the simplified variant keeps the simple goals only."""
        if split not in self.by_split:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'test'")
        return list(self.simple_by_split[split] if simplified else self.by_split[split])

    def by_type(self, split: str, simplified: bool = False) -> dict[GoalType, list[str]]:
        """The goal strings of a split, grouped by goal type (types in order of first appearance)."""
        grouped: dict[GoalType, list[str]] = {}
        for text in self.goals(split, simplified):
            grouped.setdefault(self.parse(text).type, []).append(text)
        return grouped

    def parse(self, text: str) -> Goal:
        try:
            return self._goals[text]
        except KeyError:
            raise UnknownGoalError(
                f"unknown goal {text!r}: goals look like 'Grasp red dog', 'Grow any plant' or "
                f"'Grow blue cat then grasp any red thing' (see `python -m sacglam_core.envs goals`)"
            ) from None

    def __contains__(self, text: str) -> bool:
        return text in self._goals


@cache
def catalog() -> GoalCatalog:
    """The one goal catalog (built once, ~50 ms)."""
    return GoalCatalog()


def aligned(candidate: Goal, goal: Goal) -> bool:
    """Whether `candidate` is a sub-goal of `goal` (paper, Appendix G.1): reaching `goal` the usual way
    reaches each of its parts. A part is covered when a part of `goal` with the same verb implies it
    (every object that satisfies that part satisfies it too), or, for a Grasp part, when it only grasps
    supplies that can grow the target of one of `goal`'s Grow parts."""
    return all(_covered(part, goal) for part in candidate.parts)


def _covered(part: SimpleGoal, goal: Goal) -> bool:
    for own in goal.parts:
        if own.verb == part.verb and set(own.matches) <= set(part.matches):
            return True
        if part.verb == "grasp" and own.verb == "grow":
            supplies = {
                k.index for k in KINDS if k.category == "supply" and any(KINDS[t].grows_with(k) for t in own.matches)
            }
            if set(part.matches) <= supplies:
                return True
    return False
