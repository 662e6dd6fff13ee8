"""Everything an experiment's aggregation writes under `results/<experiment>/`: its figures (PNG and PDF)
and tables (CSV and Markdown).

    python -m sacglam_core.reports.outputs main critic_architecture [--definitions ... --results ... --models ...]

writes them from the runs that finished so far (the workflow's `aggregate_*` and `figures` rules run this);
a finished run whose files do not agree is left out with one warning line (aggregate.finished_run), and an
experiment without a usable run is skipped with a message. Every error is one line. The list of outputs is known without
reading any metrics, and without importing pandas or matplotlib (the workflow reads it at parse time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sacglam_core.pipeline.experiments import DEFINITION_FILES, ExperimentError, expand, load_definitions

if TYPE_CHECKING:
    from sacglam_core.reports.aggregate import Experiment

TABLES = ("summary", "iqm", "improvement_per_goal_type", "hyperparameters", "diagnostics")
DIAGNOSTICS_FIGURE = "diagnostics"


def figure_specs(definition: dict) -> dict[str, dict]:
    """The experiment's figures: stem -> spec (`panels`, `x`, `y`, or `kind: goals` for the goal samplers' figure);
    by default one success curve."""
    return {stem: spec or {} for stem, spec in (definition.get("figures") or {"figure": {}}).items()}


def expected_outputs(name: str, definition: dict, results: Path) -> list[Path]:
    out = Path(results) / name
    stems = [*figure_specs(definition), DIAGNOSTICS_FIGURE]
    figures = [out / f"{stem}{suffix}" for stem in stems for suffix in (".png", ".pdf")]
    return figures + [out / f"{table}{suffix}" for table in TABLES for suffix in (".csv", ".md")]


def write_experiment_results(experiment: Experiment, definition: dict, results: Path) -> list[Path]:
    """Figures and tables of the experiment's usable runs (missing and left-out seeds are said, not fatal)."""
    from sacglam_core.reports.figures import curves_figure, diagnostics_figure, goals_figure, write_figure
    from sacglam_core.reports.tables import write_tables

    out = Path(results) / experiment.name
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, spec in figure_specs(definition).items():
        title = stem.replace("figure", "Figure ") if stem.startswith("figure") and stem[6:].isdigit() else stem
        figure = (
            goals_figure(experiment, title) if spec.get("kind") == "goals" else curves_figure(experiment, spec, title)
        )
        paths += write_figure(figure, out / stem)
    paths += write_figure(diagnostics_figure(experiment), out / DIAGNOSTICS_FIGURE)
    return paths + write_tables(experiment, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.reports.outputs", description=__doc__.split("\n")[0])
    parser.add_argument("experiments", nargs="+")
    parser.add_argument("--definitions", nargs="+", default=list(DEFINITION_FILES))
    parser.add_argument("--results", default="results")
    parser.add_argument("--models", default="resources/models")
    args = parser.parse_args(argv)
    try:
        definitions = load_definitions(*args.definitions)
        runs = expand(definitions, args.experiments, Path(args.results), {"models": args.models})
    except ExperimentError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from sacglam_core.reports.aggregate import load_experiment

    for name in args.experiments:
        mine = [run for run in runs if run.experiment == name]
        experiment = load_experiment(name, mine)
        for warning in experiment.warnings():
            print(warning, file=sys.stderr)
        usable, left_out = len(experiment.summaries), len(experiment.left_out)
        if not usable:
            what = f"all {left_out} finished runs are left out" if left_out else "no finished runs yet"
            print(f"{name}: {what} ({len(mine)} planned): skipped, its figures and tables are not made")
            continue
        try:
            paths = write_experiment_results(experiment, definitions["experiments"][name], Path(args.results))
        except (OSError, ValueError) as error:  # a full disk, a figure that cannot be drawn: one line
            print(f"error: {name}: cannot write its figures and tables: {error}", file=sys.stderr)
            return 1
        runs_used = f"{usable} of {len(mine)} runs" + (f" ({left_out} finished but left out)" if left_out else "")
        print(f"{name}: {len(paths)} figures and tables from {runs_used} in {paths[0].parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
