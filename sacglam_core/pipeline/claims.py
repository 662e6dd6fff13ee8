"""The paper's claims checked on an experiment's finished runs, as its definition's `claims:` states them:

    claims:
      learns: [PPO-GLAM, SAC-GLAM, SAC-GLAM+HER]  # final success above the random policy's by `margin`
      margin: 0.15
      order: [SAC-GLAM+HER, SAC-GLAM, PPO-GLAM]   # mean AUC of success against steps, best first

    python -m sacglam_core.pipeline.claims mini   # prints each claim and exits 1 if one fails

Exit status: 0 every claim holds, 1 a claim fails, 2 bad command line or experiment definition, 3 the
claims cannot be evaluated (a finished run's metrics.csv, done.json or config.yaml cannot be read).

The random policy is evaluated on the same evaluation plan (goals and scenes) as the runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sacglam_core.config import RunConfig
from sacglam_core.distributed import Ranks
from sacglam_core.evaluation import evaluate, random_policy
from sacglam_core.pipeline.aggregate import (
    Experiment,
    MetricsFileError,
    load_experiment,
    per_run,
    probability_of_improvement,
)
from sacglam_core.pipeline.experiments import ExperimentError, expand, load_definitions

CLAIM_KEYS = {"learns", "margin", "order"}
EXIT_CANNOT_EVALUATE = 3


@dataclass(frozen=True)
class Claim:
    statement: str
    holds: bool
    evidence: str


def random_success(config: RunConfig, rounds: int = 10) -> float:
    """Mean evaluation success of the uniform policy over `rounds` of the runs' evaluation plan."""
    return float(np.mean([evaluate(random_policy(seed), config, Ranks())["eval_success"] for seed in range(rounds)]))


def _mean_std(values: np.ndarray) -> str:
    if not len(values):
        return "no runs"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values.mean():.3f}"


def check(experiment: Experiment, claims: dict, baseline: float) -> list[Claim]:
    """Each claim of `claims` against the finished runs; a variant without runs fails its claims."""
    stray = set(claims) - CLAIM_KEYS
    if stray:
        raise ExperimentError(
            f"claims of {experiment.name!r} have unknown keys {sorted(stray)}; allowed: {sorted(CLAIM_KEYS)}"
        )
    runs = per_run(experiment)
    unknown = [v for v in [*claims.get("learns", []), *claims.get("order", [])] if v not in experiment.variants]
    if unknown:
        raise ExperimentError(f"claims of {experiment.name!r} name unknown variants {unknown}")

    def values(variant: str, column: str) -> np.ndarray:
        return runs.loc[runs["variant"] == variant, column].to_numpy(float) if len(runs) else np.array([])

    out = []
    margin = float(claims.get("margin", 0.15))
    for variant in claims.get("learns", []):
        final = values(variant, "final_success")
        out.append(
            Claim(
                f"{variant} learns: final success > random {baseline:.3f} + {margin}",
                bool(len(final)) and final.mean() > baseline + margin,
                f"final success {_mean_std(final)} over {len(final)} seeds ({', '.join(f'{x:.2f}' for x in final)})",
            )
        )
    order = claims.get("order", [])
    for better, worse in zip(order, order[1:]):
        a, b = values(better, "auc"), values(worse, "auc")
        both = bool(len(a) and len(b))
        p = probability_of_improvement(a[:, None], b[:, None]) if both else float("nan")  # over pairs of seeds
        out.append(
            Claim(
                f"AUC {better} > {worse}",
                both and a.mean() > b.mean(),
                f"{_mean_std(a)} vs {_mean_std(b)} (seeds {len(a)} vs {len(b)}), P(better) = {p:.2f}",
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.pipeline.claims", description=__doc__.split("\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--definitions", default="workflow/config/experiments.yaml")
    parser.add_argument("--results", default="results")
    parser.add_argument("--models", default="resources/models")
    args = parser.parse_args(argv)
    try:
        definitions = load_definitions(args.definitions)
        runs = expand(definitions, [args.experiment], Path(args.results), {"models": args.models})
        claims = definitions["experiments"][args.experiment].get("claims")
        if not claims:
            raise ExperimentError(f"experiment {args.experiment!r} states no `claims:` in {args.definitions}")
        experiment = load_experiment(args.experiment, runs)
        results = check(experiment, claims, random_success(runs[0].config))
    except ExperimentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except MetricsFileError as error:
        print(f"error: cannot evaluate the claims of {args.experiment!r}: {error}", file=sys.stderr)
        return EXIT_CANNOT_EVALUATE
    if experiment.missing():
        print(f"missing seeds: {experiment.missing()}")
    for claim in results:
        print(f"{'HOLDS ' if claim.holds else 'FAILS '} {claim.statement}: {claim.evidence}")
    return 0 if all(c.holds for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
