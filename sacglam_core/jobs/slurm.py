"""The SLURM client commands of the workflow, each with a timeout (a broken cluster shows as a hang otherwise)."""

from __future__ import annotations

import re
import shutil
import subprocess

# States of a job that still holds (or will hold) resources: the workflow waits for, or re-attaches to, these.
LIVE = frozenset(
    "PENDING RUNNING REQUEUED REQUEUE_HOLD REQUEUE_FED SUSPENDED CONFIGURING COMPLETING RESIZING SIGNALING "
    "STAGE_OUT STOPPED RESV_DEL_HOLD SPECIAL_EXIT".split()
)
TIMEOUT_S = 60


class SlurmError(RuntimeError):
    """A SLURM command that failed; the message holds its output."""


def available() -> bool:
    return all(shutil.which(command) for command in ("sbatch", "squeue", "sacct"))


def _run(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args[:2])} ...` did not answer within {timeout:.0f} s") from None
    except OSError as error:
        raise SlurmError(f"cannot run {args[0]}: {error.strerror}") from None


def queue() -> dict[str, tuple[str, str]]:
    """This user's jobs in the queue: job id -> (state, name). One squeue call for all of them."""
    result = _run("squeue", "--me", "--noheader", "--format=%i|%T|%j")
    if result.returncode:
        raise SlurmError(f"squeue failed: {(result.stderr or result.stdout).strip()}")
    jobs = {}
    for line in result.stdout.splitlines():
        job_id, state, name = line.split("|", 2)
        jobs[job_id.strip()] = (state.strip(), name.strip())
    return jobs


def final_states(job_ids: list[str]) -> dict[str, str]:
    """Accounting's state of ended jobs (CANCELLED, FAILED, COMPLETED...); those it does not know are left out."""
    if not job_ids:
        return {}
    result = _run("sacct", "-X", "--noheader", "--parsable2", "--format=JobID,State", "-j", ",".join(job_ids))
    states = {}
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        job_id, _, state = line.partition("|")
        if state:
            states[job_id.strip()] = state.split()[0]  # "CANCELLED by 1000" -> CANCELLED
    return states


def state_of(job_id: str) -> str | None:
    """One job's state in accounting (None if unknown). Inside a job that `scancel` is ending, accounting says
    CANCELLED at once, where squeue and scontrol still say COMPLETING."""
    return final_states([job_id]).get(job_id)


def test_only(script: str) -> tuple[bool, str]:
    """`sbatch --test-only` of a batch script: (accepted, sbatch's message). Nothing is submitted."""
    result = _run("sbatch", "--test-only", script)
    message = " ".join((result.stderr + result.stdout).split())
    return result.returncode == 0, message


def gpu_types(partition: str) -> set[str]:
    """The GRES types of the partition's GPUs (`gpu:a100:8` -> a100; `untyped` for `gpu:8`), from sinfo."""
    result = _run("sinfo", "--noheader", "--partition", partition, "--format=%G")
    if result.returncode:
        raise SlurmError(f"sinfo failed: {(result.stderr or result.stdout).strip()}")
    types = set()
    for gres in re.findall(r"gpu:[^,\s]+", result.stdout):
        fields = re.sub(r"\(.*", "", gres).split(":")
        types.add(fields[1] if len(fields) > 2 else "untyped")
    return types
