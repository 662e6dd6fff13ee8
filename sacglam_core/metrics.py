"""The per-run metrics file: one CSV row per evaluation, with fixed columns."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from sacglam_core.atomic import atomic_write
from sacglam_core.envs import GoalType

COLUMNS = [
    "env_steps",
    "wall_seconds",
    "train_seconds",  # acting and updates only: wall_seconds less evaluations and checkpoints
    "updates",
    "episodes",
    "train_success",
    "eval_success",
    *("eval_success_" + t.value.replace(" ", "_") for t in GoalType),
    "eval_success_test",
    "critic_loss",
    "actor_loss",
    "alpha",
    "entropy",
    "target_policy_entropy",  # SAC: the entropy of softmax(Q / alpha), the policy the actor's loss pulls towards
    "mean_q",
    "q_range",  # SAC: the mean over states of max - min of Q over the candidates
    "her_share",
    "policy_loss",
    "value_loss",
    "approx_kl",
    "clipfrac",
    "kl",
    "updates_per_s",
    "env_steps_per_s",
]
TIMING_COLUMNS = ("wall_seconds", "train_seconds", "updates_per_s", "env_steps_per_s")


class MetricsFile:
    """`metrics.csv`, rewritten whole (atomically) at every row from the rows it holds in memory.

    Checkpoints carry `rows`, so a resumed run's file is exactly the checkpoint's rows plus what follows,
    whatever happened to the file meanwhile (deleted, truncated, rows after the checkpoint)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, str]] = []

    def restore(self, rows: list[dict[str, str]]) -> None:
        """Hold `rows` (formatted, as `rows` holds them) and rewrite the file with them."""
        self.rows = [dict(row) for row in rows]
        self._write()

    def append(self, row: dict[str, float]) -> None:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown metric columns {sorted(unknown)}")
        self.rows.append({k: _fmt(v) for k, v in row.items()})
        self._write()

    def _write(self) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, COLUMNS)
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write(self.path, text.getvalue().encode())


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return str(value)
