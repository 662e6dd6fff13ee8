"""What a run's directory says about it, read without torch: finished, how far its checkpoints got, its job.

<run>/done.json                    the trainer's summary, written once at the end: the run is finished
<run>/checkpoints/ckpt-<n>.json    checkpoint manifests: `number` is the environment step, `world` the ranks
<run>/job.json                     the SLURM job the workflow submitted for it (written right after sbatch)
<run>/progress.json                the trainer's latest progress line (steps, steps/s, ETA; sacglam_core/monitor.py)
<run>/train.done                   the workflow's marker (Snakemake's output), written after done.json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sacglam_core.atomic import write_text

DONE = "done.json"
JOB_RECORD = "job.json"
PROGRESS = "progress.json"
MARKER = "train.done"
# What to do about a finished run whose files are damaged: its last checkpoint is the finished state, from which
# the trainer writes done.json, metrics.csv and config.yaml again without training a step.
REBUILD = f"delete the run's {DONE} and {MARKER} and run again: its files are rebuilt from its last checkpoint"


class RunStateError(ValueError):
    """A state file of a run that cannot be read; the message names it."""


@dataclass(frozen=True)
class Progress:
    steps: int  # environment steps of the newest checkpoint
    world: int  # ranks that wrote it
    manifest: Path


def finished(run_dir: Path) -> dict | None:
    """The run's done.json, or None while it is not finished."""
    path = Path(run_dir) / DONE
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RunStateError(f"{path} exists but cannot be read ({error}); {REBUILD}") from None
    if not isinstance(summary, dict):
        raise RunStateError(f"{path} does not hold a run summary; {REBUILD}")
    return summary


def progress(run_dir: Path) -> Progress | None:
    """The newest readable checkpoint manifest's step and ranks, or None without checkpoints."""
    for manifest in sorted((Path(run_dir) / "checkpoints").glob("ckpt-*.json"), reverse=True):
        try:
            data = json.loads(manifest.read_text())
            return Progress(int(data["number"]), int(data["world"]), manifest)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # the trainer skips it too and falls back to the previous one
    return None


def read_job(run_dir: Path) -> dict | None:
    """The job record (`job_id`, `name`, `submitted`, `driver`...) or None when none was written."""
    try:
        record = json.loads((Path(run_dir) / JOB_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("job_id") else None


def write_job(run_dir: Path, record: dict) -> None:
    write_text(Path(run_dir) / JOB_RECORD, json.dumps(record, indent=1) + "\n")
