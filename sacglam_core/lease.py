"""The run directory's lease: at most one trainer writes into an `output_dir` at a time.

The lease is an exclusive `fcntl.flock` on `<output_dir>/lease`. The kernel (or, on NFS, the lock
manager) drops it when its process ends, however it ends (kill -9 included), so there is no stale
lease to clean up. The file also holds who took it (host, pid, SLURM job id, time), so that a second
trainer can say who holds the directory. flock works across nodes on NFS (emulated with POSIX locks)
and GPFS; Lustre needs the `flock` mount option.

    with RunLease(directory):      # raises LeaseHeldError naming the holder
        ...
    holder(directory)              # the holder's record while the lease is held, else None
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LEASE_FILE = "lease"
RETRY_S = 1.0  # how long `acquire` retries a held lease: `holder()` takes it shared for a moment to look


class LeaseHeldError(RuntimeError):
    """Another live process holds the run directory."""


def _describe(record: dict | None) -> str:
    if not record:
        return "another process (no record yet)"
    job = f", SLURM job {record['slurm_job_id']}" if record.get("slurm_job_id") else ""
    return f"pid {record.get('pid')} on {record.get('host')}{job}, since {since(record, '%Y-%m-%d %H:%M:%S')}"


def since(record: dict, form: str) -> str:
    """When the holder took the lease, by its record ("?" where the record says no time)."""
    taken = record.get("time")
    valid = isinstance(taken, (int, float)) and not isinstance(taken, bool) and 0 <= taken < 1e11
    return time.strftime(form, time.localtime(taken)) if valid else "?"


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
        return None  # being written, or never written
    return record if isinstance(record, dict) else None


class RunLease:
    """An exclusive lease on a run directory, held until `release()` or the end of the process."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LEASE_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeldError naming the process that keeps it for RETRY_S."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    other = _describe(_read_record(self.path))
                    raise LeaseHeldError(
                        f"{self.path.parent} is in use by {other}; one trainer per run directory"
                    ) from None
            time.sleep(0.05)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "time": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder(directory: str | Path) -> dict | None:
    """The record of the process holding `directory`'s lease, or None when nobody holds it."""
    path = Path(directory) / LEASE_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_record(path) or {}
    finally:
        os.close(fd)
    return None
