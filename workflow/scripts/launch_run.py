"""Snakemake script of the `train` rule: write the run's configuration and launch it through submitit."""

from pathlib import Path

import yaml

from sacglam_core.atomic import atomic_write
from sacglam_core.pipeline.launch import launch

snakemake = snakemake  # noqa: F821, PLW0127 (injected by Snakemake)
run = snakemake.params.run
run.directory.mkdir(parents=True, exist_ok=True)
atomic_write(run.directory / "run.yaml", yaml.safe_dump(run.settings, sort_keys=False).encode())
environment = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(Path(snakemake.params.hf_cache).resolve())}
launch(run.directory, snakemake.params.launcher, repository=Path.cwd(), environment=environment)
