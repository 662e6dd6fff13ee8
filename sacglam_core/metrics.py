"""The per-run metrics file: one CSV row per evaluation, with fixed columns."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

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
    "mean_q",
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
    """Appends rows to `metrics.csv`; on resume, rows after the checkpoint are dropped first."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows = 0

    def truncate(self, rows: int) -> None:
        """Keep the header and the first `rows` rows (rewritten atomically)."""
        kept = self.read()[:rows] if self.path.exists() else []
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(kept)
        os.replace(tmp, self.path)
        self.rows = len(kept)

    def append(self, row: dict[str, float]) -> None:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise KeyError(f"unknown metric columns {sorted(unknown)}")
        if not self.path.exists():
            self.truncate(0)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, COLUMNS).writerow({k: _fmt(v) for k, v in row.items()})
            f.flush()
        self.rows += 1

    def read(self) -> list[dict[str, str]]:
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return str(value)
