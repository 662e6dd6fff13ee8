"""The replay buffer: n-step transitions as token ids in preallocated numpy arrays (a ring).

Each row holds the goal (an id), the observation's token ids, the candidate actions (ids in the
environment's action vocabulary), the chosen candidate, the discounted n-step reward, and the bootstrap
observation with its candidates and discount. 100,000 rows of Flan-T5-sized prompts take ~70 MB.

Batch sampling strategies (paper, Appendix E): `uniform`; `ratio`, a fixed share of hindsight
transitions per batch; `prior`, goal types drawn from the environment's goal-type distribution; and
`prior_ratio`, both.
"""

from __future__ import annotations

import numpy as np
import torch

from sacglam_core.trajectories import GOAL_TYPES, Episode, goal_id, goal_table, n_step_targets

_GROWABLE = ("obs", "next_obs", "candidates", "next_candidates")


class ReplayBuffer:
    def __init__(self, capacity: int, n_step: int, gamma: float, goal_type_prior: np.ndarray, seed: int = 0) -> None:
        self.capacity, self.n_step, self.gamma = capacity, n_step, gamma
        self.goal_type_prior = np.asarray(goal_type_prior, dtype=np.float64)
        self.rng = np.random.default_rng(seed)
        self.pos = self.size = 0
        self.data: dict[str, np.ndarray] = {
            "goal": np.zeros(capacity, np.int32),
            "goal_type": np.zeros(capacity, np.int8),
            "her": np.zeros(capacity, bool),
            "action": np.zeros(capacity, np.int16),
            "reward": np.zeros(capacity, np.float32),
            "discount": np.zeros(capacity, np.float32),
            "obs": np.zeros((capacity, 0), np.int32),
            "next_obs": np.zeros((capacity, 0), np.int32),
            "candidates": np.zeros((capacity, 0), np.int16),
            "next_candidates": np.zeros((capacity, 0), np.int16),
        }
        for name in _GROWABLE:
            self.data[f"{name}_len"] = np.zeros(capacity, np.int16)

    def __len__(self) -> int:
        return self.size

    # -- writing ---------------------------------------------------------------------------------
    def add_episode(self, episode: Episode, her: bool) -> int:
        """Add an episode's n-step transitions; returns how many."""
        returns, bootstrap, discount = n_step_targets(episode.rewards, episode.terminated, self.n_step, self.gamma)
        gid = goal_id(episode.goal)
        gtype = goal_table()[2][gid]
        for t in range(episode.length):
            row = self.pos
            self._put(row, "obs", episode.observations[t])
            self._put(row, "candidates", episode.candidates[t])
            self._put(row, "next_obs", episode.observations[bootstrap[t]])
            self._put(row, "next_candidates", episode.candidates[bootstrap[t]])
            d = self.data
            d["goal"][row], d["goal_type"][row], d["her"][row] = gid, gtype, her
            d["action"][row], d["reward"][row], d["discount"][row] = episode.actions[t], returns[t], discount[t]
            self.pos = (self.pos + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)
        return episode.length

    def _put(self, row: int, name: str, values: np.ndarray) -> None:
        array = self.data[name]
        if len(values) > array.shape[1]:  # widen the column (rare: the first rows, or a longer observation)
            wider = np.zeros((self.capacity, len(values)), array.dtype)
            wider[:, : array.shape[1]] = array
            self.data[name] = array = wider
        array[row, : len(values)] = values
        self.data[f"{name}_len"][row] = len(values)

    # -- reading ---------------------------------------------------------------------------------
    def her_share(self) -> float:
        return float(self.data["her"][: self.size].mean()) if self.size else 0.0

    def sample(self, batch_size: int, strategy: str = "uniform", her_fraction: float = 0.5) -> np.ndarray:
        """Row indices of a batch (with replacement)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        rows = np.arange(self.size)
        if strategy in ("uniform", "prior"):
            return self._from_pool(rows, batch_size, by_prior=strategy == "prior")
        if strategy not in ("ratio", "prior_ratio"):
            raise ValueError(f"unknown sampling strategy {strategy!r}")
        her = self.data["her"][: self.size]
        pools = [rows[her], rows[~her]]
        n_her = round(batch_size * her_fraction) if all(len(p) for p in pools) else (batch_size if len(pools[0]) else 0)
        by_prior = strategy == "prior_ratio"
        return np.concatenate(
            [self._from_pool(pools[0], n_her, by_prior), self._from_pool(pools[1], batch_size - n_her, by_prior)]
        )

    def _from_pool(self, pool: np.ndarray, n: int, by_prior: bool) -> np.ndarray:
        if n == 0:
            return np.zeros(0, np.int64)
        if not by_prior:
            return pool[self.rng.integers(len(pool), size=n)]
        types = self.data["goal_type"][pool]
        present = np.array([(types == k).any() for k in range(len(GOAL_TYPES))])
        prior = self.goal_type_prior * present
        if prior.sum() == 0:  # only goal types the environment never samples: fall back to uniform
            return pool[self.rng.integers(len(pool), size=n)]
        counts = self.rng.multinomial(n, prior / prior.sum())
        chosen = [pool[types == k][self.rng.integers((types == k).sum(), size=c)] for k, c in enumerate(counts) if c]
        return np.concatenate(chosen)

    def rows(self, index: np.ndarray) -> dict[str, object]:
        """The stored fields of some rows, with token sequences cut to their lengths."""
        d = self.data
        out: dict[str, object] = {k: d[k][index] for k in ("goal", "goal_type", "her", "action", "reward", "discount")}
        for name in _GROWABLE:
            lengths = d[f"{name}_len"][index]
            out[name] = [d[name][i, :n].tolist() for i, n in zip(index, lengths)]
        return out

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "pos": self.pos,
            "size": self.size,
            "rng": self.rng.bit_generator.state,
            "data": {k: torch.from_numpy(v[: self.size].copy()) for k, v in self.data.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.rng.bit_generator.state = state["rng"]
        for key, value in state["data"].items():
            array = value.numpy()
            full = np.zeros((self.capacity, *array.shape[1:]), array.dtype)
            full[: len(array)] = array
            self.data[key] = full
