"""Playground-Text: the text multi-goal environment of the paper (Appendix A), one instance.

The API follows Gymnasium: `reset(seed=, options=) -> (observation, info)` and
`step(action) -> (observation, reward, terminated, truncated, info)`. Observations and actions are
plain strings; `info["possible_actions"]` is the candidate set of the next step and
`info["achieved_goals"]` the social partner's report for the step just taken.

Rules that the spec leaves open, fixed here or made options:
- `grasp_rule` (EnvConfig): when a Grasp goal holds. `holding` (the default, as the original: its
  reward reads the grasped flag of the current state) makes it hold on every step a matching object is
  held, so "A then grasp B" is reached on the step A is reached while B is held; `event` only on the
  step a matching object is grasped, so B must be grasped on or after the step A is reached. The
  social partner reports by the same rule as the reward, so hindsight goals stay sound under both.
- Objects meet only after a `Go to`: the objects at the destination (the target and anything released
  there) and those the agent carries. Every such meeting is a growth event, so an object can grow again.
- With duplicate names, `Go to x` and `Release x` take the first such object in scene order.
"""

from __future__ import annotations

import random
from typing import Annotated, Any, Literal

from pydantic import Field

from sacglam_core.envs.goals import Goal, GoalCatalog, catalog
from sacglam_core.envs.objects import CATEGORIES, COLORS, KIND_BY_NAME, KINDS, ObjectKind
from sacglam_core.envs.partner import SocialPartner, achieved_simple_goals
from sacglam_core.settings import settings


class InvalidActionError(ValueError):
    """An action string that is not in the current candidate set."""


@settings
class EnvConfig:
    """Environment settings. `simplified` keeps only the simple goals (the paper's ablations use N=3)."""

    n_objects: int = 6
    """Objects per scene: each sub-goal's target (with a supply that grows it for Grow goals), the rest drawn at
    random. At least 4 (2 with `env.simplified`)."""
    capacity: Annotated[int, Field(ge=1)] = 2
    """Objects the agent can hold at once; `Grasp` does nothing while it holds that many."""
    max_steps: Annotated[int, Field(ge=1)] = 20
    """Horizon: an episode that has not reached its goal is cut after this many steps."""
    simplified: bool = False
    """Simple goals only, no sequential ones (the paper's ablations, with 3 objects)."""
    split: Literal["train", "test"] = "train"
    """The goal split that training episodes draw from (evaluation draws from both)."""
    grasp_rule: Literal["holding", "event"] = "holding"
    """When a Grasp goal holds: on every step a matching object is held (`holding`, as the original) or only on
    the step it is grasped (`event`); see envs/playground.py."""

    def __post_init__(self) -> None:
        # A sequential goal can need four objects: two targets and their two supplies.
        needed = 2 if self.simplified else 4
        if self.n_objects < needed:
            raise ValueError(
                f"EnvConfig.n_objects={self.n_objects} is too small: the "
                f"{'simplified' if self.simplified else 'full'} goal set needs at least {needed} objects"
            )

    @property
    def max_candidates(self) -> int:
        """The most candidate actions a state can offer: `Go to` each object not held, `Grasp`, `Release` each held
        one, and `Release all` while holding two or more."""
        return self.n_objects + 1 + int(min(self.capacity, self.n_objects) >= 2)

    @classmethod
    def simplified_variant(cls, **overrides: Any) -> EnvConfig:
        """The paper's simplified environment: simple goals only, N=3 objects."""
        return cls(**{"n_objects": 3, "simplified": True, **overrides})


GRASP = "Grasp"
RELEASE_ALL = "Release all"
GO_TO_TEXT = tuple(f"Go to {k.name}" for k in KINDS)
RELEASE_TEXT = tuple(f"Release {k.name}" for k in KINDS)
# Every action string the environment can offer, for critics with one output per action.
ACTION_VOCABULARY: tuple[str, ...] = (*GO_TO_TEXT, GRASP, *RELEASE_TEXT, RELEASE_ALL)
ACTION_INDEX: dict[str, int] = {a: i for i, a in enumerate(ACTION_VOCABULARY)}
_WATER = tuple(KIND_BY_NAME[f"{c} water"] for c in COLORS)
_SUPPLIES = tuple(KIND_BY_NAME[f"{c} {t}"] for t in CATEGORIES["supply"] for c in COLORS)
_CATEGORY_KINDS = tuple(tuple(k for k in KINDS if k.category == c) for c in CATEGORIES)


def prompt(goal: str, observation: str) -> str:
    """The paper's prompt (Figure 3): the goal, the observation, then `Action:`."""
    return f"Goal: {goal}\n{observation}\nAction:"


class PlaygroundText:
    """One Playground-Text environment."""

    def __init__(self, config: EnvConfig | None = None, seed: int | None = None) -> None:
        self.config = config or EnvConfig()
        self.catalog: GoalCatalog = catalog()
        self.goal_pool = self.catalog.goals(self.config.split, self.config.simplified)
        self.rng = random.Random(seed)
        self.partner = SocialPartner(self.catalog, sequential=not self.config.simplified)
        self.goal: Goal | None = None

    # -- episode ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Start an episode. `options` may fix `goal` (a goal string) and `scene` (object names)."""
        if seed is not None:
            self.rng.seed(seed)
        options = options or {}
        self.goal = self.catalog.parse(options["goal"] if "goal" in options else self.rng.choice(self.goal_pool))
        self.kinds: list[ObjectKind] = (
            self._parse_scene(options["scene"]) if "scene" in options else self._sample_scene(self.goal)
        )
        self.loc = list(range(len(self.kinds)))  # each object starts at a place of its own; -1 = held
        self.held: list[int] = []
        self.agent_loc = -1
        self.on = -1
        self.grown: list[int] = []  # objects grown so far, in order
        self.steps = 0
        self.first_part_reached = False
        self.done = False
        self.partner.reset()
        return self._observation(), self._info([])

    def check_action(self, action: str) -> None:
        """Raise unless `action` can be taken now: RuntimeError when no episode runs, else InvalidActionError."""
        if self.goal is None or self.done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        if action not in self._actions:
            raise InvalidActionError(f"invalid action {action!r}; valid actions now: {list(self._actions)}")

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.check_action(action)
        grasped, grown = self._apply(*self._actions[action])
        in_hand = self.held if self.config.grasp_rule == "holding" else [grasped] if grasped >= 0 else []
        achieved = achieved_simple_goals([self.kinds[s].index for s in in_hand], [self.kinds[s].index for s in grown])
        reports = self.partner.report(achieved)
        reward = float(self._update_goal_progress(achieved))
        self.steps += 1
        terminated = reward > 0
        truncated = not terminated and self.steps >= self.config.max_steps
        self.done = terminated or truncated
        return self._observation(), reward, terminated, truncated, self._info(reports)

    # -- world -----------------------------------------------------------------------------------
    def _apply(self, verb: str, slot: int) -> tuple[int, list[int]]:
        """Carry out an action; return the grasped slot (-1 if none) and the slots that grew."""
        if verb == "go":
            self.agent_loc = self.loc[slot]
            self.on = slot
            return -1, self._meet()
        if verb == "grasp":
            if self.on < 0 or len(self.held) >= self.config.capacity:
                return -1, []
            grasped, self.on = self.on, -1
            self.held.append(grasped)
            self.loc[grasped] = -1
            return grasped, []
        released = list(self.held) if verb == "release_all" else [slot]
        for s in released:
            self.held.remove(s)
            self.loc[s] = self.agent_loc
        self.on = released[-1]
        return -1, []

    def _meet(self) -> list[int]:
        """Objects at the agent's position meet: water grows living things, food grows animals."""
        here = [s for s, place in enumerate(self.loc) if place == self.agent_loc] + self.held
        supplies = [self.kinds[s] for s in here if self.kinds[s].category == "supply"]
        if not supplies:
            return []
        grown = [s for s in here if any(self.kinds[s].grows_with(sup) for sup in supplies)]
        self.grown.extend(s for s in grown if s not in self.grown)
        return grown

    def _update_goal_progress(self, achieved: list[int]) -> bool:
        """Record this step's progress; True when the whole goal is reached now."""
        parts = self.goal.parts
        if parts[0].index in achieved:
            self.first_part_reached = True
        if len(parts) == 1:
            return self.first_part_reached
        return self.first_part_reached and parts[1].index in achieved

    # -- scenes ----------------------------------------------------------------------------------
    def _sample_scene(self, goal: Goal) -> list[ObjectKind]:
        """Place each sub-goal's target (and a supply that grows it), fill the rest, shuffle."""
        rng = self.rng
        kinds: list[ObjectKind] = []
        for part in goal.parts:
            target = KINDS[rng.choice(part.matches)]
            kinds.append(target)
            if part.verb == "grow":
                kinds.append(rng.choice(_WATER if target.category == "plant" else _SUPPLIES))
        while len(kinds) < self.config.n_objects:
            kinds.append(rng.choice(rng.choice(_CATEGORY_KINDS)))
        rng.shuffle(kinds)
        return kinds

    def _parse_scene(self, names: list[str]) -> list[ObjectKind]:
        unknown = [n for n in names if n not in KIND_BY_NAME]
        if unknown:
            raise ValueError(f"unknown object names in scene: {unknown}; objects are named '<color> <type>'")
        if len(names) != self.config.n_objects:
            raise ValueError(f"scene has {len(names)} objects; this environment has n_objects={self.config.n_objects}")
        return [KIND_BY_NAME[n] for n in names]

    # -- text ------------------------------------------------------------------------------------
    def _observation(self) -> str:
        kinds = self.kinds
        seen = ", ".join([kinds[s].name for s, place in enumerate(self.loc) if place >= 0]) or "nothing"
        on = kinds[self.on].name if self.on >= 0 else "nothing"
        holding = ", ".join([kinds[s].name for s in self.held]) or "nothing"
        grown = ", ".join([kinds[s].name for s in self.grown]) or "nothing"
        return f"You see: {seen}\nYou are on: {on}\nYou are holding: {holding}\nYou have grown: {grown}"

    def _info(self, reports: list[str]) -> dict:
        actions: dict[str, tuple[str, int]] = {}
        for s, place in enumerate(self.loc):
            if place >= 0:
                actions.setdefault(GO_TO_TEXT[self.kinds[s].index], ("go", s))
        actions[GRASP] = ("grasp", -1)
        for s in self.held:
            actions.setdefault(RELEASE_TEXT[self.kinds[s].index], ("release", s))
        if len(self.held) >= 2:
            actions[RELEASE_ALL] = ("release_all", -1)
        self._actions = actions
        return {"goal": self.goal.text, "possible_actions": list(actions), "achieved_goals": reports}

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain-Python state (safe for `torch.load(weights_only=True)`)."""
        state = {"rng": self.rng.getstate(), "goal": None if self.goal is None else self.goal.text}
        if self.goal is not None:
            state |= {
                "scene": [k.name for k in self.kinds],
                "loc": list(self.loc),
                "held": list(self.held),
                "agent_loc": self.agent_loc,
                "on": self.on,
                "grown": list(self.grown),
                "steps": self.steps,
                "first_part_reached": self.first_part_reached,
                "done": self.done,
                "partner": self.partner.state_dict(),
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        if state["goal"] is not None:
            self.reset(options={"goal": state["goal"], "scene": state["scene"]})
            for key in ("loc", "held", "agent_loc", "on", "grown", "steps", "first_part_reached", "done"):
                setattr(self, key, state[key])
            self.partner.load_state_dict(state["partner"])
            self._info([])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
