"""What the workflow records about a run beside what the run writes itself (sacglam_core/runfiles.py): its job.

<run>/job.json    the SLURM job the workflow submitted for it (written right after sbatch)
"""

from __future__ import annotations

import json
from pathlib import Path

from sacglam_core.atomic import write_text
from sacglam_core.runfiles import RunStateError, diverged, finished, progress, read_record, value

JOB_RECORD = "job.json"


def job_record(run_dir: Path) -> dict | None:
    """The job record (`job_id`, `name`, `submitted`, `driver`, `ended`...) or None when none was written."""
    path = Path(run_dir) / JOB_RECORD
    found = read_record(path, "a job record")
    if found is not None:
        value(path, found, "job_id", str)
        value(path, found, "ended", str, None)
    return found


def read_job(run_dir: Path) -> dict | None:
    """The job record, or None when none was written or it cannot be read (the driver then finds the run's job by
    its name)."""
    try:
        return job_record(run_dir)
    except RunStateError:
        return None


def next_launch(run_dir: Path, queued: bool) -> str:
    """What a launch that plans the run does with it, in the budget's words: `finished` (it writes the marker
    only), `in queue` (`queued`: its recorded job is live; it re-attaches), `diverged` (it trains it no more),
    `resumes` (from its newest checkpoint) or `new`. RunStateError when its done.json or diverged.json cannot be
    read: the launch refuses to start."""
    if finished(run_dir) is not None:
        return "finished"
    if queued:
        return "in queue"
    if diverged(run_dir) is not None:
        return "diverged"
    checkpoint = progress(run_dir)
    return "resumes" if checkpoint and checkpoint.steps else "new"


def write_job(run_dir: Path, record: dict) -> None:
    write_text(Path(run_dir) / JOB_RECORD, json.dumps(record, indent=1) + "\n")
