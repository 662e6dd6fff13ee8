"""The paper's claims checked on an experiment's finished runs, as its definition's `claims:` states them:

    claims:
      learns: [PPO-GLAM, SAC-GLAM, SAC-GLAM+HER]  # final success above each run's own start by `margin`
      margin: 0.15
      learns_at_least: 0.8  # the share of seeds that must (default 0.8)
      better:  # probability of improvement of the AUC of success against steps, over pairs of seeds
        - {x: SAC-GLAM+HER, y: PPO-GLAM, at_least: 0.8}
        - {x: SAC-GLAM+HER, y: PPO-GLAM, at_least: 0.6, goal_type: grow}  # the AUC of grow goals' success
      time:  # mean training time (acting and updates) of x over y's
        - {x: SAC-GLAM+HER, y: PPO-GLAM, at_most: 2.0}

    python -m sacglam_core.reports.claims mini   # prints each claim and exits 1 if one fails
    python -m sacglam_core.reports.claims mini_ten_seeds --seeds 5 6 7 8 9   # on some of its seeds only
    python -m sacglam_core.reports.claims mini_longer --from-step 6400   # AUCs over the evaluations from 6,400 on

A `learns` claim holds when the share of a variant's seeds whose final success beats the run's own start (its
step-0 evaluation: the untrained agent, the prior where there is one) by `margin` is at least `learns_at_least`;
a second line checks the same against the random policy's success. A `better` claim holds when P(x > y), the share
of seed pairs where x's AUC beats y's (ties count half), is at least `at_least`; a `time` claim when the ratio of
mean training times is at most `at_most`. Each is printed with its 95% bootstrap interval (seeds of each variant
resampled independently): with 5 seeds the interval is wide, and says how far the evidence goes.

Exit status: 0 every claim holds, 1 a claim fails, 2 bad command line or experiment definition. A finished run
whose files do not agree (aggregate.finished_run) is left out with one warning line, as from the tables.

The random policy is evaluated on the same evaluation plan (goals and scenes) as the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from sacglam_core.config import RunConfig
from sacglam_core.envs.goals import GoalType
from sacglam_core.evaluation import evaluate, random_policy
from sacglam_core.pipeline.experiments import DEFINITION_FILES, ExperimentError, expand, load_definitions, parse_claims
from sacglam_core.reports.aggregate import (
    GOAL_TYPE_COLUMNS,
    Experiment,
    area_under_curve,
    load_experiment,
    per_run,
    probability_of_improvement,
    stratified_bootstrap,
)


@dataclass(frozen=True)
class Claim:
    statement: str
    holds: bool
    evidence: str


def random_success(config: RunConfig, rounds: int = 10) -> float:
    """Mean evaluation success of the uniform policy over `rounds` of the runs' evaluation plan."""
    return float(np.mean([evaluate(partial(random_policy, seed), config)["eval_success"] for seed in range(rounds)]))


def _mean_std(values: np.ndarray) -> str:
    if not len(values):
        return "no runs"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values.mean():.3f}"


def _ratio_of_means(x: np.ndarray, y: np.ndarray) -> float:
    return float(x.mean() / y.mean())


def _share_above(final: np.ndarray, reference: np.ndarray, margin: float) -> float:
    return float((final > reference + margin).mean())


def _gains(
    name: str,
    final: np.ndarray,
    reference: np.ndarray,
    margin: float,
    at_least: float,
    of: str,
    error: np.ndarray | None = None,
) -> Claim:
    """P(final > reference + margin) over a variant's seeds, each against its own reference (its step-0 evaluation,
    or the random policy's success), with its 95% bootstrap interval, against `at_least`; `error`: each reference's
    standard error, where it is a mean of several rounds."""
    statement = f"{name}: P(final success > {of} + {margin}) >= {at_least}"
    if not len(final):
        return Claim(statement, False, "no finished runs")
    share = _share_above(final, reference, margin)
    pairs = np.stack([final, reference], 1)
    low, high = stratified_bootstrap(lambda m: _share_above(m[:, 0], m[:, 1], margin), pairs)
    # each seed against its own start; the random policy is one figure for all, said once before
    own = of == "its own start"
    per_seed = ", ".join(f"{f:.3f} from {r:.3f}" if own else f"{f:.3f}" for f, r in zip(final, reference))
    known = error[np.isfinite(error)] if error is not None else np.array([])
    noise = f" (standard error {known.mean():.3f})" if len(known) else ""
    evidence = (
        f"P = {share:.2f} [95% CI {low:.2f}, {high:.2f}] over {len(final)} seeds; {of} {reference.mean():.3f}{noise}, "
        f"final success {_mean_std(final)} (per seed: {per_seed})"
    )
    return Claim(statement, share >= at_least, evidence)


def _between(
    statement: str,
    a: np.ndarray,
    b: np.ndarray,
    statistic: Callable[[np.ndarray, np.ndarray], float],
    passes: Callable[[float], bool],
    evidence: Callable[[float, float, float], str],
    no_runs: str,
    incomplete: str,
) -> Claim:
    """A claim on `statistic` of two variants' seeds (rows of `a` and `b`) with its 95% stratified-bootstrap
    interval; it fails, saying so, where one variant has no finished runs (`no_runs`) or a value is missing."""
    if not (len(a) and len(b)):
        return Claim(statement, False, no_runs)
    if np.isnan(a).any() or np.isnan(b).any():
        return Claim(statement, False, incomplete)
    value = statistic(a, b)
    return Claim(statement, passes(value), evidence(value, *stratified_bootstrap(statistic, a, b)))


def check(experiment: Experiment, claims: dict | None, baseline: float) -> list[Claim]:
    """Each claim of `claims` against the finished runs; a variant without runs fails its claims."""
    spec = parse_claims(experiment.name, claims, list(experiment.variants))
    runs = per_run(experiment)

    def values(variant: str, column: str) -> np.ndarray:
        return runs.loc[runs["variant"] == variant, column].to_numpy(float) if len(runs) else np.array([])

    def goal_type_aucs(variant: str, goal_type: str) -> np.ndarray:
        """Per seed, the AUC of `goal_type`'s success curve (NaN where a point lacks it)."""
        column = GOAL_TYPE_COLUMNS[GoalType(goal_type)]
        curves = experiment.curves[experiment.curves["variant"] == variant]
        return np.array(
            [
                area_under_curve(run["env_steps"].to_numpy(float), run[column].to_numpy(float))
                if column in run.columns
                else np.nan
                for _, run in curves.groupby("seed", sort=True)
            ]
        )

    out = []
    for variant in spec.learns:
        final, start = values(variant, "final_success"), values(variant, "start_success")
        error = values(variant, "start_success_se")
        out.append(_gains(f"{variant} learns", final, start, spec.margin, spec.learns_at_least, "its own start", error))
        out.append(
            _gains(
                f"{variant} beats the random policy",
                final,
                np.full(len(final), baseline),
                spec.margin,
                spec.learns_at_least,
                "the random policy",
            )  # fmt: skip
        )
    for claim in spec.better:
        if claim.goal_type is None:
            auc, a, b = "AUC", values(claim.x, "auc")[:, None], values(claim.y, "auc")[:, None]
        else:
            auc = f"AUC of {claim.goal_type}"
            a, b = goal_type_aucs(claim.x, claim.goal_type)[:, None], goal_type_aucs(claim.y, claim.goal_type)[:, None]
        out.append(
            _between(
                f"P({auc} {claim.x} > {claim.y}) >= {claim.at_least}",
                a,
                b,
                probability_of_improvement,
                lambda p, at_least=claim.at_least: p >= at_least,
                lambda p, low, high, a=a, b=b, auc=auc: (
                    f"P = {p:.2f} [95% CI {low:.2f}, {high:.2f}] over {len(a)} x {len(b)} seed pairs; "
                    f"{auc} {_mean_std(a[:, 0])} vs {_mean_std(b[:, 0])}"
                    + ("; the interval holds 0.5: no ordering either way" if low <= 0.5 <= high else "")
                ),
                f"no finished runs of {claim.x if not len(a) else claim.y}",
                f"{claim.goal_type} is not evaluated at every point of every run",
            )  # fmt: skip
        )
    for claim in spec.time:
        a, b = values(claim.x, "train_hours")[:, None], values(claim.y, "train_hours")[:, None]
        missing = "training time not recorded for every finished run"
        out.append(
            _between(
                f"training time {claim.x} / {claim.y} <= {claim.at_most}",
                a,
                b,
                _ratio_of_means,
                lambda ratio, at_most=claim.at_most: ratio <= at_most,
                lambda ratio, low, high, a=a, b=b: (
                    f"ratio {ratio:.2f} [95% CI {low:.2f}, {high:.2f}]; training minutes "
                    f"{_mean_std(a[:, 0] * 60)} vs {_mean_std(b[:, 0] * 60)}"
                ),
                missing,
                missing,
            )  # fmt: skip
        )
    return out


def late_window(experiment: Experiment, step: int) -> Experiment:
    """The experiment with each run's curve cut to its evaluations at `step` and later; every finished run must
    keep two of them, or its AUC would be a single point."""
    late = experiment.curves[experiment.curves["env_steps"] >= step]
    kept = late.groupby(["variant", "seed"]).size().reindex(list(experiment.summaries), fill_value=0)
    if step < 0 or (kept < 2).any():
        raise ExperimentError(f"--from-step {step} leaves fewer than two evaluations in a run of {experiment.name!r}")
    return dataclasses.replace(experiment, curves=late)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.reports.claims", description=__doc__.split("\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--definitions", nargs="+", default=list(DEFINITION_FILES))
    parser.add_argument("--results", default="results")
    parser.add_argument("--models", default="resources/models")
    parser.add_argument(
        "--seeds", type=int, nargs="+", help="only these of the experiment's seeds (say, a replication on new seeds)"
    )
    parser.add_argument(
        "--from-step", type=int, help="AUCs over the evaluations at this environment step and later (a late window)"
    )
    args = parser.parse_args(argv)
    try:
        definitions = load_definitions(*args.definitions)
        runs = expand(definitions, [args.experiment], Path(args.results), {"models": args.models})
        if args.seeds:
            unknown = sorted(set(args.seeds) - {run.seed for run in runs})
            if unknown:
                raise ExperimentError(f"experiment {args.experiment!r} has no seeds {unknown}")
            runs = [run for run in runs if run.seed in args.seeds]
            print(f"on seeds {', '.join(map(str, sorted(set(args.seeds))))} of {args.experiment} only")
        claims = definitions["experiments"][args.experiment].get("claims")
        if not claims:
            raise ExperimentError(
                f"experiment {args.experiment!r} states no `claims:` in {' or '.join(args.definitions)}"
            )
        experiment = load_experiment(args.experiment, runs)
        for warning in experiment.warnings():
            print(warning, file=sys.stderr)
        if args.from_step is not None:
            experiment = late_window(experiment, args.from_step)
            print(f"AUCs over the evaluations from step {args.from_step:,} on")
        results = check(experiment, claims, random_success(runs[0].config))
    except ExperimentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    note = experiment.missing_note()
    if note:
        print(note[0].lower() + note[1:])
    for claim in results:
        print(f"{'HOLDS ' if claim.holds else 'FAILS '} {claim.statement}: {claim.evidence}")
    return 0 if all(c.holds for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
