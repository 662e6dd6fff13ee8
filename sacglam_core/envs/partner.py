"""The social partner: after every step it reports the train goals the agent achieved on that step."""

from __future__ import annotations

from functools import cache

from sacglam_core.envs.goals import GoalCatalog, catalog
from sacglam_core.envs.objects import KINDS


@cache
def descriptions_by_kind() -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """For every object kind, the simple Grasp goals and the simple Grow goals that describe it."""
    grasp: list[list[int]] = [[] for _ in KINDS]
    grow: list[list[int]] = [[] for _ in KINDS]
    for goal in catalog().simple:
        for kind in goal.matches:
            (grasp if goal.verb == "grasp" else grow)[kind].append(goal.index)
    return tuple(map(tuple, grasp)), tuple(map(tuple, grow))


def achieved_simple_goals(grasp_kinds: list[int], grown_kinds: list[int]) -> list[int]:
    """Indices of the simple goals (both splits) that hold on a step: Grasp goals of the objects that count
    as grasped (held, or grasped this step, by the environment's grasp rule), Grow goals of those grown."""
    grasp_descs, grow_descs = descriptions_by_kind()
    achieved: dict[int, None] = {}  # an ordered set, so reports come in a reproducible order
    for kind in grasp_kinds:
        achieved.update(dict.fromkeys(grasp_descs[kind]))
    for kind in grown_kinds:
        achieved.update(dict.fromkeys(grow_descs[kind]))
    return list(achieved)


class SocialPartner:
    """Reports simple goals that hold this step and `P then h` goals whose P held earlier or now.

    Only train goals are reported, each at most once per episode; with `sequential=False` (the
    simplified variant, whose goal space has no sequential goals) only simple ones.
    """

    def __init__(self, goals: GoalCatalog | None = None, sequential: bool = True) -> None:
        self._catalog = goals or catalog()
        self._train_simple = frozenset(
            self._catalog.parse(t).parts[0].index for t in self._catalog.simple_by_split["train"]
        )
        self._train_sequential = self._catalog.sequential["train"] if sequential else {}
        self.reset()

    def reset(self) -> None:
        self.reported: set[str] = set()
        self._grown_so_far: dict[int, None] = {}  # simple Grow goals that held on some step

    def report(self, achieved: list[int]) -> list[str]:
        """The new train goals achieved on a step where the simple goals `achieved` hold."""
        if not achieved:
            return []
        simple = self._catalog.simple
        self._grown_so_far.update((i, None) for i in achieved if simple[i].verb == "grow")
        reports = [simple[i].text for i in achieved if i in self._train_simple and simple[i].text not in self.reported]
        for first in self._grown_so_far:
            for second in achieved:
                text = self._train_sequential.get((first, second))
                if text is not None and text not in self.reported:
                    reports.append(text)
        self.reported.update(reports)
        return reports

    def state_dict(self) -> dict:
        return {"reported": sorted(self.reported), "grown_so_far": list(self._grown_so_far)}

    def load_state_dict(self, state: dict) -> None:
        self.reported = set(state["reported"])
        self._grown_so_far = dict.fromkeys(state["grown_so_far"])
