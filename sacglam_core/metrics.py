"""The per-run metrics file: one CSV row per evaluation, with fixed columns, and the steps at which a run
evaluates (the rows a finished run's file must hold)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from sacglam_core.atomic import atomic_write
from sacglam_core.envs import GoalType

if TYPE_CHECKING:
    from sacglam_core.config import RunConfig

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
    "eval_success_se",  # at step 0 with eval.start_rounds > 1: the standard error of the rounds' mean
    "planner_policy_share",  # planner_probe.py: how often the policy's most likely action is a best one
    "planner_chance_share",  # how often a uniform choice is
    "planner_q_share",  # SAC: how often argmax Q is a best one
    "planner_q_gap",  # SAC: Q of the planner's action less the others' mean
    "planner_true_gap",  # the same gap in the planner's returns
    "planner_alpha_logp_gap",  # SAC: alpha x the same gap in log pi
    "critic_loss",
    "actor_loss",
    "alpha",
    "entropy",
    "target_policy_entropy",  # SAC: the entropy of softmax(Q / alpha), the policy the actor's loss pulls towards
    "mean_q",
    "q_range",  # SAC: the mean over states of max - min of Q over the candidates
    "policy_kl",  # KL(pi before an update || pi after it) on the update's states, SAC's actor updates and PPO's
    "policy_kl_max",  # the largest of those measurements since the last row: one update's jump, or every update's
    "policy_kl_state_max",  # SAC: the mean over the row's measurements of the largest KL of one state in each
    "policy_kl_state_max_max",  # SAC: the largest KL of one state since the last row
    "her_share",
    "goals_known",  # with a goal sampler other than `uniform`: goals the agent knows (the first rank's)
    "goal_buckets",  # with it: JSON, per bucket the share of goals drawn since the last row (share/) and LP (lp/)
    "policy_loss",
    "value_loss",
    "approx_kl",
    "clipfrac",
    "kl",
    "updates_per_s",
    "env_steps_per_s",
]
TIMING_COLUMNS = ("wall_seconds", "train_seconds", "updates_per_s", "env_steps_per_s")


def evaluates_at(config: RunConfig, env_steps: int) -> bool:
    """Whether the trainer evaluates (one metrics row) on reaching `env_steps`: the untrained agent at 0, then at
    the first step of each `eval.every_steps` (steps advance by num_envs) and at the end."""
    return env_steps % config.eval.every_steps < config.num_envs or env_steps >= config.total_steps


def evaluation_steps(config: RunConfig) -> list[int]:
    """Every step a finished run evaluated at, in order: the `env_steps` column of its metrics.csv."""
    last = -(-config.total_steps // config.num_envs) * config.num_envs  # the loop ends at the first step >= total
    return [step for step in range(0, last + 1, config.num_envs) if evaluates_at(config, step)]


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
