"""Episodes as compact token-id records, their n-step transitions and their hindsight relabelling."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch

from sacglam_core.envs.goals import GoalType, aligned, catalog
from sacglam_core.envs.playground import ACTION_INDEX, ACTION_VOCABULARY

GOAL_TYPES: tuple[GoalType, ...] = tuple(GoalType)


@cache
def goal_table() -> tuple[tuple[str, ...], dict[str, int], np.ndarray]:
    """Every goal of both splits with an integer id, and each goal's type (an index into GOAL_TYPES)."""
    goals = catalog()
    texts = tuple(goals.goals("train") + goals.goals("test"))
    types = np.array([GOAL_TYPES.index(goals.parse(t).type) for t in texts], dtype=np.int8)
    return texts, {t: i for i, t in enumerate(texts)}, types


def goal_id(goal: str) -> int:
    return goal_table()[1][goal]


def action_ids(actions: list[str]) -> np.ndarray:
    """Candidate actions as indices into the environment's action vocabulary."""
    return np.array([ACTION_INDEX[a] for a in actions], dtype=np.int16)


def action_texts(ids: np.ndarray) -> list[str]:
    return [ACTION_VOCABULARY[i] for i in ids]


@dataclass
class Episode:
    """One episode: observation token ids and candidate-action ids for steps 0..T (T+1 entries, the
    last one after the final step), and for steps 0..T-1 the chosen candidate, reward and partner report."""

    goal: str
    observations: list[np.ndarray] = field(default_factory=list)
    candidates: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    reports: list[list[str]] = field(default_factory=list)
    terminated: bool = False
    extras: dict[str, list] = field(default_factory=dict)  # per-step algorithm data (e.g. PPO's log-probs)
    described_before: list[str] = field(default_factory=list)  # reports of the episode's earlier segments (`cut`)

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def described(self) -> list[str]:
        """Every goal the partner reported since the episode began, earlier segments included."""
        return self.described_before + [goal for step in self.reports for goal in step]

    def state_dict(self) -> dict:
        """Tensors and plain Python only (safe for `torch.load(weights_only=True)`)."""
        return {
            "goal": self.goal,
            "observations": [torch.from_numpy(o) for o in self.observations],
            "candidates": [torch.from_numpy(c) for c in self.candidates],
            "actions": self.actions,
            "rewards": self.rewards,
            "reports": self.reports,
            "terminated": self.terminated,
            "described_before": self.described_before,
            "extras": {
                k: [torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in v] for k, v in self.extras.items()
            },
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> Episode:
        return cls(
            goal=state["goal"],
            observations=[o.numpy() for o in state["observations"]],
            candidates=[c.numpy() for c in state["candidates"]],
            actions=list(state["actions"]),
            rewards=list(state["rewards"]),
            reports=[list(r) for r in state["reports"]],
            terminated=state["terminated"],
            described_before=list(state.get("described_before", ())),  # absent from checkpoints written before it
            extras={
                k: [x.numpy() if isinstance(x, torch.Tensor) else x for x in v] for k, v in state["extras"].items()
            },
        )


def relabelled(episode: Episode, aligned_only: bool = False) -> list[Episode]:
    """Hindsight copies (future strategy): for each goal the partner reported at step k, the episode up to
    k with that goal, reward 1 at k and the end there. With `aligned_only`, only goals aligned with the
    episode's own goal (paper, Appendix G.1)."""
    copies = []
    goals = catalog()
    original = goals.parse(episode.goal)
    for k, reports in enumerate(episode.reports):
        for goal in reports:
            if goal == episode.goal or (aligned_only and not aligned(goals.parse(goal), original)):
                continue
            copies.append(
                Episode(
                    goal=goal,
                    observations=episode.observations[: k + 2],
                    candidates=episode.candidates[: k + 2],
                    actions=episode.actions[: k + 1],
                    rewards=[0.0] * k + [1.0],
                    reports=episode.reports[: k + 1],
                    terminated=True,
                    extras={key: values[: k + 1] for key, values in episode.extras.items()},
                )
            )
    return copies


def n_step_targets(
    rewards: list[float], terminated: bool, n: int, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each step t: the discounted n-step reward sum, the index of the bootstrap observation and its
    discount (gamma^k, or 0 when the episode terminated within n steps). A time-limit end is not terminal:
    its last observation is bootstrapped."""
    length = len(rewards)
    returns = np.zeros(length, dtype=np.float32)
    bootstrap = np.zeros(length, dtype=np.int64)
    discount = np.zeros(length, dtype=np.float32)
    for t in range(length):
        horizon = min(n, length - t)
        returns[t] = sum(gamma**i * rewards[t + i] for i in range(horizon))
        bootstrap[t] = t + horizon
        discount[t] = 0.0 if (terminated and t + horizon == length) else gamma**horizon
    return returns, bootstrap, discount


class EpisodeRecorder:
    """Turns a vector environment's steps into `Episode`s of token ids, one open episode per environment.

    `step` returns the episodes that ended; `cut` ends every open one early (PPO's rollout boundary) and
    starts a new segment of the same episode from the current observation.
    """

    def __init__(self, tokens) -> None:
        self.tokens = tokens
        self.open: list[Episode] = []

    def reset(self, goals: list[str], observations: list[str], candidates: list[list[str]]) -> None:
        self.open = [self._start(g, o, c) for g, o, c in zip(goals, observations, candidates)]

    def _start(self, goal: str, observation: str, candidates: list[str]) -> Episode:
        return Episode(goal, [np.asarray(self.tokens.observation(observation))], [action_ids(candidates)])

    def step(
        self,
        choices: list[int],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        observations: list[str],
        infos: dict,
        extras: dict[str, list] | None = None,
    ) -> list[Episode]:
        finished = []
        for i, episode in enumerate(self.open):
            done = bool(terminated[i] or truncated[i])
            step_info = infos["final_info"][i] if done else None
            last_obs = infos["final_obs"][i] if done else observations[i]
            last_candidates = step_info["possible_actions"] if done else infos["possible_actions"][i]
            episode.actions.append(int(choices[i]))
            episode.rewards.append(float(rewards[i]))
            episode.reports.append(step_info["achieved_goals"] if done else infos["achieved_goals"][i])
            for key, values in (extras or {}).items():
                episode.extras.setdefault(key, []).append(values[i])
            episode.observations.append(np.asarray(self.tokens.observation(last_obs)))
            episode.candidates.append(action_ids(last_candidates))
            if done:
                episode.terminated = bool(terminated[i])
                finished.append(episode)
                self.open[i] = self._start(infos["goal"][i], observations[i], infos["possible_actions"][i])
        return finished

    def cut(self) -> list[Episode]:
        segments = [e for e in self.open if e.length > 0]
        self.open = [
            Episode(e.goal, [e.observations[-1]], [e.candidates[-1]], described_before=e.described)
            if e.length > 0
            else e
            for e in self.open
        ]
        return segments

    def prompts(self) -> list[list[int]]:
        return [self.tokens.join(self.tokens.goal(e.goal), e.observations[-1].tolist()) for e in self.open]

    def candidates(self) -> list[np.ndarray]:
        return [e.candidates[-1] for e in self.open]

    def state_dict(self) -> dict:
        return {"open": [e.state_dict() for e in self.open]}

    def load_state_dict(self, state: dict) -> None:
        self.open = [Episode.from_state_dict(s) for s in state["open"]]
