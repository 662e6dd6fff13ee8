"""Snakemake script of the `aggregate_<experiment>` rules: the experiment's figures and tables."""

from sacglam_core.pipeline.outputs import write_experiment_results

snakemake = snakemake  # noqa: F821 (injected by Snakemake)
params = snakemake.params
write_experiment_results(params.experiment, params.definition, params.runs, params.results)
