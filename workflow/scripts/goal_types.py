"""Snakemake script of the `goal_types` rule: Figure 4, from the environment's goal catalogue."""

from pathlib import Path

from sacglam_core.pipeline.figures import goal_types_figure, write_figure

snakemake = snakemake  # noqa: F821 (injected by Snakemake)
write_figure(goal_types_figure(), Path(snakemake.output[0]).with_suffix(""))
