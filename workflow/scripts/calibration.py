"""Snakemake script of the `calibration` rule: the measured throughput of finished runs, per key."""

from pathlib import Path

import yaml

from sacglam_core.atomic import write_text
from sacglam_core.pipeline.budget import load_calibration

snakemake = snakemake  # noqa: F821 (injected by Snakemake)
results = Path(snakemake.output[0]).parent
calibration = load_calibration(snakemake.params.table, results)
summary = {
    "default_steps_per_gpu_hour": calibration.default,
    "seeded": calibration.seeded,
    "measured_steps_per_gpu_hour": {k: round(v, 1) for k, v in sorted(calibration.measured.items())},
}
write_text(snakemake.output[0], yaml.safe_dump(summary, sort_keys=False))
