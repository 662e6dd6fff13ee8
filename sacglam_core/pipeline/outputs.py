"""Everything an experiment's aggregation writes under `results/<experiment>/`: its figures (PNG and PDF)
and tables (CSV and Markdown)."""

from __future__ import annotations

from pathlib import Path

from sacglam_core.pipeline.aggregate import load_experiment
from sacglam_core.pipeline.experiments import Run
from sacglam_core.pipeline.figures import curves_figure, write_figure
from sacglam_core.pipeline.tables import write_tables

TABLES = ("summary", "iqm", "probability_of_improvement", "hyperparameters")


def figure_specs(definition: dict) -> dict[str, dict]:
    """The experiment's figures: stem -> spec (`panels`, `x`, `y`); by default one success curve."""
    return definition.get("figures") or {"figure": {}}


def expected_outputs(name: str, definition: dict, results: Path) -> list[Path]:
    out = results / name
    figures = [out / f"{stem}{suffix}" for stem in figure_specs(definition) for suffix in (".png", ".pdf")]
    return figures + [out / f"{table}{suffix}" for table in TABLES for suffix in (".csv", ".md")]


def write_experiment_results(name: str, definition: dict, runs: list[Run], results: Path) -> list[Path]:
    """Figures and tables from the finished runs among `runs` (missing seeds are said, not fatal)."""
    experiment = load_experiment(name, runs)
    out = results / name
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, spec in figure_specs(definition).items():
        title = stem.replace("figure", "Figure ") if stem.startswith("figure") and stem[6:].isdigit() else stem
        paths += write_figure(curves_figure(experiment, spec, title), out / stem)
    return paths + write_tables(experiment, out)
