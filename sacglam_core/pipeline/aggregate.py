"""Per-seed metrics turned into the paper's numbers: curves' mean and std across seeds, and per variant
the final success, area under the success curve, steps to 50% and 80%, success per goal type and on
the test split, throughput and GPU-hours; beyond the paper, the interquartile mean with stratified-
bootstrap confidence intervals and the probability of improvement between variants.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from sacglam_core.config import ConfigError, RunConfig, load_config
from sacglam_core.envs import GoalType
from sacglam_core.evaluation import metric_name
from sacglam_core.pipeline.experiments import Run

REQUIRED_COLUMNS = ("env_steps", "wall_seconds", "eval_success")
GOAL_TYPE_COLUMNS = {t: metric_name(t) for t in GoalType}


class MetricsFileError(ValueError):
    """A finished run's metrics (metrics.csv, done.json) or config.yaml that cannot be read; the message
    names the file."""


def _short_rows(path: Path) -> str | None:
    """The first row with fewer fields than the header (pandas would fill them in silently), if any."""
    with path.open(newline="", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        for row in reader:
            if row and len(row) < len(header):
                return f"line {reader.line_num} has {len(row)} fields, the header {len(header)}"
    return None


def read_metrics(path: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(path)
        short = _short_rows(path)
    except (OSError, ValueError, csv.Error, pd.errors.ParserError) as error:
        raise MetricsFileError(f"cannot read metrics file {path}: {error}") from None
    if short:
        raise MetricsFileError(f"metrics file {path} has a truncated row: {short}")
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise MetricsFileError(f"metrics file {path} lacks the columns {missing}")
    if table.empty:
        raise MetricsFileError(f"metrics file {path} has no rows")
    numeric = table.apply(pd.to_numeric, errors="coerce")
    bad = [c for c in REQUIRED_COLUMNS if numeric[c].isna().any()]
    if bad:
        raise MetricsFileError(f"metrics file {path} has non-numeric or empty values in {bad}")
    if not numeric["env_steps"].is_monotonic_increasing:
        raise MetricsFileError(f"metrics file {path}: env_steps is not increasing")
    return numeric


@dataclass
class Experiment:
    """The finished runs of one experiment (long table: one row per run and evaluation) and what is missing."""

    name: str
    curves: pd.DataFrame  # variant, seed, env_steps, wall_hours, metrics...
    summaries: dict[tuple[str, int], dict]  # (variant, seed) -> done.json
    expected: dict[str, list[int]]  # variant -> seeds
    configs: dict[str, RunConfig]  # variant -> the configuration a run used

    @property
    def variants(self) -> list[str]:
        return list(self.expected)

    def seeds(self, variant: str) -> list[int]:
        return sorted(self.curves.loc[self.curves["variant"] == variant, "seed"].unique().tolist())

    def missing(self) -> dict[str, list[int]]:
        return {v: sorted(set(s) - set(self.seeds(v))) for v, s in self.expected.items() if set(s) - set(self.seeds(v))}

    def label(self, variant: str) -> str:
        return f"{variant} (n={len(self.seeds(variant))}/{len(self.expected[variant])})"


def load_experiment(name: str, runs: list[Run]) -> Experiment:
    """Metrics of the runs that finished (a done.json); the others are reported as missing seeds."""
    frames, summaries, expected, configs = [], {}, {}, {}
    for run in runs:
        expected.setdefault(run.variant, []).append(run.seed)
        done = run.directory / "done.json"
        if not done.exists():
            continue
        table = read_metrics(run.directory / "metrics.csv")
        table.insert(0, "seed", run.seed)
        table.insert(0, "variant", run.variant)
        table["wall_hours"] = table["wall_seconds"] / 3600
        table["train_hours"] = table["train_seconds"] / 3600 if "train_seconds" in table else float("nan")
        frames.append(table)
        summaries[(run.variant, run.seed)] = _read_summary(done)
        config_file = run.directory / "config.yaml"
        used = run.config
        if config_file.exists():
            try:
                used = load_config(config_file)
            except ConfigError as error:
                raise MetricsFileError(str(error)) from None
        configs.setdefault(run.variant, used)
    empty = pd.DataFrame(columns=["variant", "seed", *REQUIRED_COLUMNS])
    curves = pd.concat(frames, ignore_index=True) if frames else empty
    return Experiment(name, curves, summaries, expected, configs)


def _read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise MetricsFileError(f"cannot read run summary {path}: {error}") from None
    if not isinstance(summary, dict):
        raise MetricsFileError(f"run summary {path} is not a JSON object")
    return summary


# -- per-run statistics ---------------------------------------------------------------------------
def area_under_curve(steps: np.ndarray, success: np.ndarray) -> float:
    """Trapezoidal area under success(steps), divided by the step range: the mean success over training."""
    if len(steps) < 2 or steps[-1] == steps[0]:
        return float(success[-1])
    return float(np.trapezoid(success, steps) / (steps[-1] - steps[0]))


def steps_to(steps: np.ndarray, success: np.ndarray, threshold: float) -> float:
    """The first evaluated step with success at or above `threshold` (NaN if never)."""
    reached = np.flatnonzero(success >= threshold)
    return float(steps[reached[0]]) if len(reached) else float("nan")


def per_run(experiment: Experiment) -> pd.DataFrame:
    rows = []
    for (variant, seed), run in experiment.curves.groupby(["variant", "seed"], sort=False):
        steps, success = run["env_steps"].to_numpy(float), run["eval_success"].to_numpy(float)
        last = run.iloc[-1]
        summary = experiment.summaries[(variant, seed)]
        hours = summary.get("wall_seconds", last["wall_seconds"]) / 3600
        row = {
            "variant": variant,
            "seed": seed,
            "final_success": float(success[-1]),
            "auc": area_under_curve(steps, success),
            "steps_to_50": steps_to(steps, success, 0.5),
            "steps_to_80": steps_to(steps, success, 0.8),
            "test_success": float(last.get("eval_success_test", np.nan)),
            "env_steps_per_s": float(summary.get("env_steps", steps[-1]) / max(hours * 3600, 1e-9)),
            "gpu_hours": float(summary.get("gpus", 0) * hours),
            "wall_hours": float(hours),
            "train_hours": float(summary.get("train_seconds", last.get("train_seconds", np.nan))) / 3600,
        }
        for column in GOAL_TYPE_COLUMNS.values():
            row[column.removeprefix("eval_")] = float(last[column]) if column in run.columns else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def summary_table(experiment: Experiment) -> pd.DataFrame:
    """One row per variant: mean and std across seeds of every per-run statistic."""
    runs = per_run(experiment)
    rows = []
    for variant in experiment.variants:
        mine = runs[runs["variant"] == variant] if len(runs) else runs
        row = {"variant": variant, "seeds": f"{len(mine)}/{len(experiment.expected[variant])}"}
        for column in [c for c in runs.columns if c not in ("variant", "seed")]:
            values = mine[column].dropna().to_numpy(float) if len(mine) else np.array([])
            row[f"{column}_mean"] = float(values.mean()) if len(values) else np.nan
            row[f"{column}_std"] = float(values.std(ddof=1)) if len(values) > 1 else np.nan
            if column.startswith("steps_to"):
                row[f"{column}_reached"] = f"{len(values)}/{len(mine)}"
        rows.append(row)
    return pd.DataFrame(rows)


def curves_mean_std(experiment: Experiment, metric: str = "eval_success", x: str = "env_steps") -> pd.DataFrame:
    """Mean and std across seeds of `metric` at each evaluation point (x: env_steps, or wall hours
    averaged over the seeds at that evaluation)."""
    grouped = experiment.curves.groupby(["variant", "env_steps"], sort=False)
    table = grouped.agg(mean=(metric, "mean"), std=(metric, "std"), seeds=(metric, "count"), x=(x, "mean"))
    return table.reset_index()


# -- beyond the paper: rliable's estimators, with numpy/scipy -------------------------------------
# rliable 1.2 installs here but cannot be imported (its `arch` dependency breaks on pandas 3), so these
# follow its definitions (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", NeurIPS
# 2021): IQM is the 25%-trimmed mean of all run x task scores; confidence intervals come from the
# stratified bootstrap (runs resampled with replacement within each task); the probability of
# improvement P(X > Y) is the Mann-Whitney statistic (ties count one half) averaged over tasks.
def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of a [runs, tasks] score matrix."""
    return float(stats.trim_mean(scores.reshape(-1), 0.25))


def stratified_bootstrap(statistic, *matrices: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of `statistic(*matrices)` with runs resampled within each task."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(reps):
        resampled = []
        for m in matrices:
            idx = rng.integers(m.shape[0], size=m.shape)  # per task (column), independent run draws
            resampled.append(np.take_along_axis(m, idx, axis=0))
        values.append(statistic(*resampled))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) for [runs, tasks] score matrices of two algorithms, averaged over tasks."""
    per_task = []
    for task in range(x.shape[1]):
        a, b = x[:, task][:, None], y[:, task][None, :]
        per_task.append(float(((a > b) + 0.5 * (a == b)).mean()))
    return float(np.mean(per_task))


def score_matrix(experiment: Experiment, variant: str) -> np.ndarray:
    """Final success per goal type (the tasks) for each finished seed: [runs, tasks]."""
    runs = per_run(experiment)
    mine = runs[runs["variant"] == variant]
    columns = [c.removeprefix("eval_") for c in GOAL_TYPE_COLUMNS.values() if c.removeprefix("eval_") in mine]
    matrix = mine[columns].to_numpy(float)
    return matrix[:, ~np.isnan(matrix).all(axis=0)] if len(matrix) else matrix


def robust_table(experiment: Experiment) -> tuple[pd.DataFrame, pd.DataFrame]:
    """IQM with 95% CIs per variant, and P(row variant > column variant) with CIs."""
    matrices = {v: score_matrix(experiment, v) for v in experiment.variants}
    matrices = {v: m for v, m in matrices.items() if m.size}
    iqm_rows = []
    for variant, m in matrices.items():
        low, high = stratified_bootstrap(iqm, m)
        iqm_rows.append({"variant": variant, "runs": m.shape[0], "iqm": iqm(m), "ci_low": low, "ci_high": high})
    pairs = []
    for a, ma in matrices.items():
        for b, mb in matrices.items():
            if a != b and ma.shape[1] == mb.shape[1]:
                low, high = stratified_bootstrap(probability_of_improvement, ma, mb)
                p = probability_of_improvement(ma, mb)
                pairs.append({"x": a, "y": b, "p_x_better": p, "ci_low": low, "ci_high": high})
    return pd.DataFrame(iqm_rows), pd.DataFrame(pairs)
