"""The run directory as a trainer takes it: its lease held by rank 0, the temporary files of killed writes removed,
writable, whether it holds this run already finished; and the record of a run that diverged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sacglam_core import runfiles
from sacglam_core.atomic import atomic_write, check_writable, remove_stale_temporaries
from sacglam_core.distributed import Ranks
from sacglam_core.lease import LeaseHeldError, RunLease


class RunDirectoryError(RuntimeError):
    """An output_dir this run cannot use: not writable, or holding a finished run of another configuration."""


def take(out: Path, ranks: Ranks) -> RunLease:
    """The directory's lease, taken by rank 0 before anything in it is touched; every rank learns whether that
    worked (LeaseHeldError or RunDirectoryError where it did not)."""
    lease = RunLease(out)
    error: Exception | None = None
    if ranks.is_main:
        try:
            lease.acquire()
            for directory in (out, out / "checkpoints"):
                if directory.is_dir():  # refused now, not at the first checkpoint
                    check_writable(directory)
                for path in remove_stale_temporaries(directory):
                    print(f"{out}: removed {path.name}, left by a killed write", file=sys.stderr)
        except LeaseHeldError as held:
            error = held
        except OSError as unwritable:
            error = RunDirectoryError(f"cannot write to output_dir {out}: {unwritable}")
    problem = ranks.gather_strings(str(error or ""))[0]
    if error is not None:
        lease.release()
        raise error
    if problem:
        raise RunDirectoryError(f"rank 0 could not take the run directory: {problem}")
    return lease


def record_divergence(out: Path, error: str, env_steps: int) -> None:
    """Say where training diverged and which checkpoint is the last finite one (none was written after it), in one
    line and in diverged.json; a relaunch would resume from it and diverge again."""
    latest = runfiles.progress(out)
    last = f"last finite checkpoint at step {latest.steps:,}" if latest else "no checkpoint was written"
    record = {"message": f"{error}; {last}", "env_steps": env_steps, "checkpoint": latest and latest.steps}
    atomic_write(out / runfiles.DIVERGED, json.dumps(record, indent=1).encode())
    print(f"error: {out}: {record['message']}", file=sys.stderr)


def finished(out: Path, fingerprint: str) -> bool:
    """Whether done.json marks the run finished; a finished run of another configuration is refused."""
    try:
        summary = runfiles.finished(out)
    except runfiles.RunStateError as error:
        raise RunDirectoryError(str(error)) from None
    if summary is None:
        return False
    if summary.get("fingerprint") != fingerprint:
        raise RunDirectoryError(
            f"{out} holds a finished run of another configuration (fingerprint {summary.get('fingerprint')}, "
            f"this run {fingerprint}); use a new output_dir"
        )
    return True
