"""Which goal an environment pursues next: the paper's uniform draw over the train goals, or an autotelic agent's
own choice among the goals it knows.

- `uniform`: the environment draws among its goals (the paper; nothing here runs).
- `discovered`: the agent knows the goals its social partner has described to it so far, plus an initial set
  (empty by default, as in IMAGINE, Colas et al. 2020), and draws among them uniformly; before it knows any, the
  environment draws.
- `learning_progress`: among the buckets of the known goals, one is drawn with probability proportional to the
  absolute learning progress of the agent's competence on it, or uniformly (a share epsilon of the draws, and
  all of them while no bucket shows progress), then a goal uniformly within the bucket (MAGELLAN, Gaven et al.
  2025, its EK-Online-ALP sampler). The known goals are the discovered ones (this project's variant) or, with
  `known: train`, every train goal from the start (MAGELLAN's); epsilon is constant, or decays exponentially
  with the episodes observed (MAGELLAN's schedule, `epsilon_decay`). Buckets are the goal grammar's (goal type x
  the category of the objects it names, MAGELLAN's expert knowledge), the user's (glob patterns over goal
  strings), or made online from competence (goals grouped by their success rate: this project's design, MAGELLAN
  keeps one bucket per goal).

Competence is the success of the agent's own training episodes, by the goal each pursued: the last `window`
outcomes per bucket (per goal for online buckets), and learning progress is |mean of the newer half - mean of the
older half| (MAGELLAN's `lp = |sr - sr_delayed|`, its `srdiff_args.buffer_size` outcomes per bucket). The sampler's
state, its random generator and the schedule's position included, is checkpointed with the run.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from fnmatch import fnmatchcase

from sacglam_core.config import GoalsConfig
from sacglam_core.envs import EnvConfig, catalog
from sacglam_core.envs.goals import Goal
from sacglam_core.envs.objects import KINDS, LIVING_CATEGORIES


def grammar_bucket(goal: Goal) -> str:
    """`<goal type> <category>`: the category of the objects the goal's last part names (`living_thing` when it
    names animals and plants, `thing` when it names living and other objects)."""
    categories = {KINDS[k].category for k in goal.parts[-1].matches}
    if len(categories) == 1:
        category = categories.pop()
    else:
        category = "living_thing" if categories <= set(LIVING_CATEGORIES) else "thing"
    return f"{goal.type.value} {category}"


def grammar_buckets(env: EnvConfig) -> list[str]:
    """Every grammar bucket of the environment's train goals, in a fixed order."""
    goals = catalog()
    return sorted({grammar_bucket(goals.parse(g)) for g in goals.goals(env.split, env.simplified)})


def learning_progress(outcomes: Iterable[float]) -> float:
    """|mean of the newer half - mean of the older half| of a window of 0/1 outcomes (0 below two outcomes)."""
    values = list(outcomes)
    half = len(values) // 2
    if half == 0:
        return 0.0
    older, newer = values[: len(values) - half], values[len(values) - half :]
    return abs(sum(newer) / len(newer) - sum(older) / len(older))


class GoalSampler:
    """The goals a run's environments pursue, from the agent's own training episodes."""

    def __init__(self, config: GoalsConfig, env: EnvConfig, seed: int) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.train = catalog().goals(env.split, env.simplified)
        self.known: list[str] = []  # in the order they became known
        self._known: set[str] = set()
        for goal in self.train if config.known == "train" else config.initial:  # initial: train goals (goal_problems)
            self._learn(goal)
        self.episodes = 0  # observed: the clock of epsilon's decay
        self.bucket_of = {g: self._fixed_bucket(g) for g in self.train}
        self.outcomes: dict[str, deque[float]] = {}  # bucket (or goal, for online buckets) -> recent outcomes
        self.drawn: dict[str, int] = {}  # bucket -> goals drawn since the last `statistics`

    def _fixed_bucket(self, goal: str) -> str:
        buckets = self.config.buckets
        if not isinstance(buckets, dict):
            return grammar_bucket(catalog().parse(goal))
        return next(
            (name for name, patterns in buckets.items() if any(fnmatchcase(goal, p) for p in patterns)), "other"
        )

    # -- choosing --------------------------------------------------------------------------------
    def next_goal(self) -> str | None:
        """The next episode's goal, or None to let the environment draw one."""
        if self.config.sampler == "uniform" or not self.known:
            return None
        if self.config.sampler == "discovered":
            goal = self.rng.choice(self.known)
        else:  # MAGELLAN's EK-Online-ALP: a bucket by progress, or uniformly (epsilon, or no progress anywhere)
            buckets = self.buckets()
            names = list(buckets)
            weights = [self.bucket_progress(name, members) for name, members in buckets.items()]
            if self.rng.random() < self.epsilon or sum(weights) <= 0:
                name = self.rng.choice(names)
            else:
                name = self.rng.choices(names, weights=weights)[0]
            goal = self.rng.choice(buckets[name])
        self.drawn[self.bucket_name(goal)] = self.drawn.get(self.bucket_name(goal), 0) + 1
        return goal

    @property
    def epsilon(self) -> float:
        """The share of bucket draws made uniformly now: `epsilon`, or MAGELLAN's decay from `epsilon_start`."""
        end, start, decay = self.config.epsilon, self.config.epsilon_start, self.config.epsilon_decay
        return end if decay is None else end + (start - end) * math.exp(-self.episodes / decay)

    def buckets(self) -> dict[str, list[str]]:
        """The known goals by bucket (each bucket's goals in the order they became known)."""
        out: dict[str, list[str]] = {}
        for goal in self.known:
            out.setdefault(self.bucket_name(goal), []).append(goal)
        return out

    def bucket_name(self, goal: str) -> str:
        if self.config.buckets != "competence":
            return self.bucket_of[goal]
        levels = self.config.competence_levels
        level = min(int(self.competence(goal) * levels), levels - 1)
        return f"competence {level / levels:.2f}-{(level + 1) / levels:.2f}"

    def competence(self, goal: str) -> float:
        """The goal's success rate over its recent outcomes (0 before any)."""
        outcomes = self.outcomes.get(goal, ())
        return sum(outcomes) / len(outcomes) if outcomes else 0.0

    def bucket_progress(self, name: str, members: list[str]) -> float:
        """A bucket's learning progress: its own window's (fixed buckets), or its goals' mean (online buckets)."""
        if self.config.buckets != "competence":
            return learning_progress(self.outcomes.get(name, ()))
        return sum(learning_progress(self.outcomes.get(g, ())) for g in members) / len(members)

    # -- learning from episodes ------------------------------------------------------------------
    def observe(self, goal: str, success: bool, described: Iterable[str]) -> None:
        """A finished training episode: the goal it pursued, whether it succeeded, and what the social partner
        described during it (train goals only)."""
        if self.config.sampler == "uniform":
            return
        self.episodes += 1
        for text in described:
            if text in self.bucket_of:  # a train goal (the partner describes no other)
                self._learn(text)
        if self.config.sampler == "learning_progress" and goal in self.bucket_of:
            key = goal if self.config.buckets == "competence" else self.bucket_of[goal]
            self.outcomes.setdefault(key, deque(maxlen=self.config.window)).append(float(success))

    def _learn(self, goal: str) -> None:
        if goal not in self._known:
            self._known.add(goal)
            self.known.append(goal)

    # -- what a user sees ------------------------------------------------------------------------
    def statistics(self) -> dict[str, float]:
        """Goals known, and per bucket the share of the goals drawn since the last call and its learning
        progress (`goals/share/<bucket>`, `goals/lp/<bucket>`)."""
        stats = {"goals_known": float(len(self.known))}
        total = sum(self.drawn.values())
        buckets = self.buckets()
        for name in [*buckets, *(n for n in self.drawn if n not in buckets)]:  # competence buckets may have emptied
            stats[f"share/{name}"] = self.drawn.get(name, 0) / total if total else 0.0
            if self.config.sampler == "learning_progress" and name in buckets:
                stats[f"lp/{name}"] = self.bucket_progress(name, buckets[name])
        self.drawn = {}
        return stats

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "rng": self.rng.getstate(),
            "known": list(self.known),
            "outcomes": {k: list(v) for k, v in self.outcomes.items()},
            "drawn": dict(self.drawn),
            "episodes": self.episodes,
        }

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.known, self._known = list(state["known"]), set(state["known"])
        self.outcomes = {k: deque(v, maxlen=self.config.window) for k, v in state["outcomes"].items()}
        self.drawn = dict(state["drawn"])
        self.episodes = state.get("episodes", 0)  # absent from checkpoints written before it (constant epsilon)
