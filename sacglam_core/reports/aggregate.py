"""Per-seed metrics turned into the paper's numbers: curves' mean and std across seeds, and per variant
the final success, area under the success curve, steps to 50% and 80%, success per goal type and on
the test split, throughput and GPU-hours; beyond the paper, the interquartile mean with stratified-
bootstrap confidence intervals and the probability of improvement between variants.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from sacglam_core import runfiles
from sacglam_core.config import ConfigError, RunConfig, load_config
from sacglam_core.envs import GoalType
from sacglam_core.evaluation import metric_name, success_standard_error
from sacglam_core.metrics import evaluation_steps
from sacglam_core.pipeline.experiments import Run

REQUIRED_COLUMNS = ("env_steps", "wall_seconds", "eval_success")
GOAL_TYPE_COLUMNS = {t: metric_name(t) for t in GoalType}


class MetricsFileError(ValueError):
    """A finished run whose files (metrics.csv, done.json, config.yaml) cannot be read or do not agree with each
    other; the message names the file and what is wrong."""


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
    if "goal_buckets" in table:  # JSON per row (the goal sampler's buckets), kept as text
        numeric["goal_buckets"] = table["goal_buckets"]
    bad = [c for c in REQUIRED_COLUMNS if numeric[c].isna().any()]
    if bad:
        raise MetricsFileError(f"metrics file {path} has non-numeric or empty values in {bad}")
    if not numeric["env_steps"].is_monotonic_increasing:
        raise MetricsFileError(f"metrics file {path}: env_steps is not increasing")
    return numeric


def _read_summary(path: Path) -> dict:
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise MetricsFileError(f"cannot read run summary {path}: {error}") from None
    if not isinstance(summary, dict):
        raise MetricsFileError(f"run summary {path} is not a JSON object")
    for key, kind in (("fingerprint", str), ("env_steps", int), ("eval_success", int | float)):
        if isinstance(summary.get(key), bool) or not isinstance(summary.get(key), kind):
            raise MetricsFileError(f"run summary {path} records no {key}")
    return summary


def _steps_list(steps) -> str:
    steps = sorted(steps)
    return ", ".join(f"{s:,}" for s in steps[:5]) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")


def finished_run(run: Run) -> tuple[pd.DataFrame, dict, RunConfig]:
    """A finished run's metrics, done.json and configuration, once they agree: the configuration in config.yaml
    is the one whose fingerprint done.json records, and metrics.csv holds exactly one row per evaluation that
    configuration makes, ending at the step and with the final success that done.json records. A file damaged
    or edited after the run finished fails one of these; the error names the file and what is wrong."""
    done = run.directory / runfiles.DONE
    summary = _read_summary(done)
    config_file = run.directory / "config.yaml"
    try:
        config = load_config(config_file)
    except ConfigError as error:
        raise MetricsFileError(str(error)) from None
    if config.fingerprint != summary["fingerprint"]:
        raise MetricsFileError(
            f"run configuration {config_file} has fingerprint {config.fingerprint}, but {done} records "
            f"{summary['fingerprint']}: it is not the configuration the run trained with (edited?)"
        )
    path = run.directory / "metrics.csv"
    table = read_metrics(path)
    steps = table["env_steps"].astype(int).tolist()
    expected = evaluation_steps(config)
    if steps[-1] != summary["env_steps"]:
        raise MetricsFileError(
            f"metrics file {path} ends at step {steps[-1]:,}, but {done} records {summary['env_steps']:,}"
        )
    repeated = {s for s in steps if steps.count(s) > 1}
    if repeated:
        raise MetricsFileError(f"metrics file {path} repeats the evaluations at steps {_steps_list(repeated)}")
    missing = set(expected) - set(steps)
    if missing:
        raise MetricsFileError(f"metrics file {path} lacks the evaluations at steps {_steps_list(missing)}")
    extra = set(steps) - set(expected)
    if extra:
        raise MetricsFileError(
            f"metrics file {path} has evaluations at steps {_steps_list(extra)}, which {config_file} never makes"
        )
    final = float(table["eval_success"].iloc[-1])
    if not math.isclose(final, summary["eval_success"], rel_tol=1e-9, abs_tol=1e-12):
        raise MetricsFileError(
            f"metrics file {path} ends with success {final:.4g}, but {done} records {summary['eval_success']:.4g}"
        )
    return table, summary, config


@dataclass
class Experiment:
    """The finished runs of one experiment (long table: one row per run and evaluation) and what is missing."""

    name: str
    curves: pd.DataFrame  # variant, seed, env_steps, wall_hours, metrics...
    summaries: dict[tuple[str, int], dict]  # (variant, seed) -> done.json
    expected: dict[str, list[int]]  # variant -> seeds
    configs: dict[str, RunConfig]  # variant -> the configuration a run used
    left_out: dict[tuple[str, int], str] = field(default_factory=dict)  # finished runs that failed a check: why

    @property
    def variants(self) -> list[str]:
        return list(self.expected)

    def seeds(self, variant: str) -> list[int]:
        return sorted(self.curves.loc[self.curves["variant"] == variant, "seed"].unique().tolist())

    def missing(self) -> dict[str, list[int]]:
        """Seeds without usable results, per variant: unfinished or left out."""
        return {v: sorted(set(s) - set(self.seeds(v))) for v, s in self.expected.items() if set(s) - set(self.seeds(v))}

    def left_out_seeds(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for variant, seed in sorted(self.left_out):
            out.setdefault(variant, []).append(seed)
        return out

    def missing_note(self) -> str:
        """The seeds without results, and among them the finished runs left out because a check failed."""
        parts = [
            f"{what}: " + "; ".join(f"{v}: {s}" for v, s in seeds.items())
            for what, seeds in (("Missing seeds", self.missing()), ("left out", self.left_out_seeds()))
            if seeds
        ]
        if self.left_out:
            parts[-1] += " (finished, but their files failed the aggregation's checks; the warnings say why)"
        return ", of which ".join(parts)

    def warnings(self) -> list[str]:
        """One line per finished run left out of the tables."""
        return [
            f"warning: {problem}; {variant} seed {seed} is left out of {self.name}'s tables ({runfiles.REBUILD})"
            for (variant, seed), problem in sorted(self.left_out.items())
        ]

    def label(self, variant: str) -> str:
        return f"{variant} (n={len(self.seeds(variant))}/{len(self.expected[variant])})"


def load_experiment(name: str, runs: list[Run]) -> Experiment:
    """Metrics of the runs that finished (a done.json) and pass `finished_run`'s checks; the others are missing
    seeds, and those that finished but failed a check are `left_out`, with why."""
    frames, summaries, expected, configs, left_out = [], {}, {}, {}, {}
    for run in runs:
        expected.setdefault(run.variant, []).append(run.seed)
        if not (run.directory / runfiles.DONE).exists():
            continue
        try:
            table, summary, used = finished_run(run)
        except MetricsFileError as error:
            left_out[(run.variant, run.seed)] = str(error)
            continue
        table.insert(0, "seed", run.seed)
        table.insert(0, "variant", run.variant)
        table["wall_hours"] = table["wall_seconds"] / 3600
        table["train_hours"] = table["train_seconds"] / 3600 if "train_seconds" in table else float("nan")
        frames.append(table)
        summaries[(run.variant, run.seed)] = summary
        configs.setdefault(run.variant, used)
    empty = pd.DataFrame(columns=["variant", "seed", *REQUIRED_COLUMNS])
    curves = pd.concat(frames, ignore_index=True) if frames else empty
    return Experiment(name, curves, summaries, expected, configs, left_out)


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
        config = experiment.configs[variant]
        errors = [success_standard_error(point, config) for point in run.to_dict("records")]
        row = {
            "variant": variant,
            "seed": seed,
            "start_success": float(success[0]),  # the step-0 evaluation: the untrained agent (the prior)
            # its standard error over eval.start_rounds rounds (NaN with one round)
            "start_success_se": float(pd.to_numeric(run["eval_success_se"], errors="coerce").iloc[0])
            if "eval_success_se" in run
            else np.nan,
            "final_success": float(success[-1]),
            "final_success_se": errors[-1],  # the evaluation's own noise, not the spread over seeds
            "largest_se": max(errors),  # over the run's evaluation points
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
        row["left_out"] = len(experiment.left_out_seeds().get(variant, []))
        for column in [c for c in runs.columns if c not in ("variant", "seed")]:
            values = mine[column].dropna().to_numpy(float) if len(mine) else np.array([])
            row[f"{column}_mean"] = float(values.mean()) if len(values) else np.nan
            row[f"{column}_std"] = float(values.std(ddof=1)) if len(values) > 1 else np.nan
            if column.startswith("steps_to"):
                row[f"{column}_reached"] = f"{len(values)}/{len(mine)}"
        rows.append(row)
    return pd.DataFrame(rows)


# What explains a collapse or a steady climb (docs/demo.md): the actor's step size, the policy's entropy, and for
# SAC the target its loss pulls towards (softmax(Q / alpha): its entropy, the critic's spread of Q, alpha); and how
# both rank actions against the environment's planner (planner_probe.py), beside the gaps the critic must resolve.
DIAGNOSTICS = (
    "policy_kl",
    "entropy",
    "target_policy_entropy",
    "q_range",
    "alpha",
    "planner_policy_share",
    "planner_q_share",
    "planner_q_gap",
    "planner_true_gap",
    "planner_alpha_logp_gap",
)


def diagnostics_table(experiment: Experiment) -> pd.DataFrame:
    """One row per run, then one per variant (seed `mean`, the mean over its seeds): the success at the start, its
    lowest after the start and at the end; each diagnostic's mean over the run's rows and its last value; the
    largest policy KL of one measurement (`policy_kl_max`; in runs from before it, of a row's mean)."""
    rows = []
    for (variant, seed), run in experiment.curves.groupby(["variant", "seed"], sort=False):
        success = run["eval_success"].to_numpy(float)
        row = {"variant": variant, "seed": seed, "start_success": success[0], "final_success": success[-1]}
        row["lowest_success"] = float(success[1:].min()) if len(success) > 1 else np.nan
        for column in DIAGNOSTICS:
            values = pd.to_numeric(run[column], errors="coerce").dropna() if column in run else pd.Series(dtype=float)
            row[f"{column}_mean"] = float(values.mean()) if len(values) else np.nan
            row[f"{column}_final"] = float(values.iloc[-1]) if len(values) else np.nan
        for kl in ("policy_kl_max", "policy_kl"):  # one measurement's; in runs from before it, a row's mean
            values = pd.to_numeric(run[kl], errors="coerce").dropna() if kl in run else pd.Series(dtype=float)
            if len(values):
                break
        row["policy_kl_max"] = float(values.max()) if len(values) else np.nan
        rows.append(row)
    runs = pd.DataFrame(rows)
    if runs.empty:
        return runs
    means = runs.drop(columns="seed").groupby("variant", sort=False).mean().reset_index()
    means.insert(1, "seed", "mean")
    return pd.concat([runs.astype({"seed": object}), means], ignore_index=True)


def goal_bucket_curves(experiment: Experiment) -> pd.DataFrame:
    """The goal samplers' buckets in long form: variant, seed, env_steps, bucket, share (of the goals drawn since
    the previous row) and lp (its learning progress at the row; NaN for samplers without it). A bucket that another
    seed of the variant knows has share 0 in a row without it, so that the mean shares over seeds add up to 1."""
    records = []
    if "goal_buckets" in experiment.curves:
        for record in experiment.curves.dropna(subset=["goal_buckets"]).to_dict("records"):
            values = json.loads(record["goal_buckets"]) if isinstance(record["goal_buckets"], str) else {}
            if values:
                records.append((record, values))
    buckets: dict[str, set[str]] = {}
    for record, values in records:
        buckets.setdefault(record["variant"], set()).update(key.split("/", 1)[1] for key in values)
    rows = []
    for record, values in records:
        where = {"variant": record["variant"], "seed": record["seed"], "env_steps": record["env_steps"]}
        for bucket in sorted(buckets[record["variant"]]):
            share, lp = values.get(f"share/{bucket}", 0.0), values.get(f"lp/{bucket}", np.nan)
            rows.append(where | {"bucket": bucket, "share": share, "lp": lp})
    return pd.DataFrame(rows, columns=["variant", "seed", "env_steps", "bucket", "share", "lp"])


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
