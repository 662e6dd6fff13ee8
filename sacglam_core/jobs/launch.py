"""Launch one training run: a SLURM job through submitit (or a local process) that runs the trainer, inside
the Apptainer image when one is configured, with one task (one rank) per GPU.

On SLURM's time-limit signal (USR2) or a preemption (TERM) the trainer checkpoints and exits with status 75;
the job then requeues itself and the next attempt resumes from the checkpoint, unless SLURM cancelled it
(`scancel`): a cancelled job is never requeued. Every attempt appends a line to `<run>/attempts.jsonl` (job
id, restart count, visible GPUs, exit status).

The code the trainer runs is the repository's: one copy, bound into the image and first on PYTHONPATH
(the image holds the dependencies only). `apptainer exec --cleanenv` keeps the login environment out
(`~/.local` packages, a site PYTHONPATH); the variables the trainer needs are passed by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from sacglam_core import EXIT_DIVERGED, EXIT_PREEMPTED
from sacglam_core.jobs import slurm
from sacglam_core.pipeline.config import LauncherConfig

# Variables of the job's environment that reach the trainer inside the image (`--cleanenv` drops the rest).
PASSED_PREFIXES = ("SLURM_", "CUDA_", "NCCL_", "HF_", "TORCH_", "OMP_", "MKL_", "TOKENIZERS_")
PASSED_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED", "TMPDIR")


@dataclass(frozen=True)
class TrainerCommand:
    """How to start the trainer of one run: with this Python, or inside an Apptainer image."""

    run_config: str  # <run>/run.yaml
    repository: str  # absolute: bound into the image and put on PYTHONPATH
    container: str | None = None
    binds: tuple[str, ...] = ()  # absolute paths bound into the image besides the repository
    environment: tuple[tuple[str, str], ...] = ()  # set for the trainer (over the job's own environment)

    def process(self, extra: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """(argv, environment of the process) for the job's environment plus `extra` (e.g. the ranks')."""
        wanted = {**dict(self.environment), **(extra or {})}
        wanted |= {"PYTHONPATH": self.repository, "PYTHONNOUSERSITE": "1"}
        train = ["-m", "sacglam_core.train", "--config", self.run_config]
        if self.container is None:
            return [sys.executable, *train], {**os.environ, **wanted}
        passed = {k: v for k, v in os.environ.items() if k.startswith(PASSED_PREFIXES) or k in PASSED_NAMES}
        passed |= wanted
        argv = ["apptainer", "exec", "--nv", "--cleanenv", "--pwd", self.repository]
        argv += ["--bind", ",".join(dict.fromkeys([self.repository, *self.binds]))]
        for name, value in sorted(passed.items()):
            argv += ["--env", f"{name}={value}"]
        return [*argv, self.container, "python", *train], dict(os.environ)


def trainer_command(
    run_dir: Path, launcher: LauncherConfig, repository: Path, data_paths: list[Path], environment: dict[str, str]
) -> TrainerCommand:
    """The run's trainer command; `data_paths` (results, models, hf_cache) are bound when outside the repository."""
    repository = repository.resolve()
    env = {"PYTHONUNBUFFERED": "1", **(launcher.environment or {}), **environment}
    if launcher.threads_per_task:
        env |= {"OMP_NUM_THREADS": str(launcher.threads_per_task), "MKL_NUM_THREADS": str(launcher.threads_per_task)}
    binds = []
    for path in [*data_paths, *map(Path, launcher.binds)]:
        path = path.resolve()
        if path.exists() and not path.is_relative_to(repository):
            binds.append(str(path))
    return TrainerCommand(
        str(run_dir / "run.yaml"),
        str(repository),
        str(Path(launcher.container).resolve()) if launcher.container else None,
        tuple(binds),
        tuple(sorted(env.items())),
    )


def record_attempt(run_dir: Path, job_id: str, tasks: int, status: int) -> None:
    attempt = {
        "job_id": job_id,
        "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        "host": socket.gethostname(),
        "tasks": tasks,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "exit_status": status,
        "time": time.time(),
    }
    with open(Path(run_dir) / "attempts.jsonl", "a") as f:
        f.write(json.dumps(attempt) + "\n")


# -- in the SLURM job ----------------------------------------------------------------------------------
class TrainingJob(submitit.helpers.Checkpointable):
    """The callable submitit runs in every task of the job: one trainer process (one rank) per task."""

    def __init__(self, run_dir: str, command: TrainerCommand) -> None:
        self.run_dir, self.command = run_dir, command
        self._process: subprocess.Popen | None = None
        self._reaper: threading.Thread | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_process", "_reaper")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _process=None, _reaper=None)

    def __call__(self) -> dict | None:
        job = submitit.JobEnvironment()
        done = Path(self.run_dir) / "done.json"
        if done.exists():  # finished is final: an attempt that finds the run finished starts nothing
            return json.loads(done.read_text()) if job.global_rank == 0 else None
        ranks = {}
        if job.num_tasks > 1:
            distributed = submitit.helpers.TorchDistributedEnvironment()
            ranks = {"MASTER_ADDR": distributed.master_addr, "MASTER_PORT": str(distributed.master_port),
                     "RANK": str(distributed.rank), "WORLD_SIZE": str(distributed.world_size),
                     "LOCAL_RANK": str(distributed.local_rank)}  # fmt: skip
        argv, env = self.command.process(ranks)
        self._process = subprocess.Popen(argv, env=env, cwd=self.command.repository)
        status = self._wait_for_trainer()
        # The outcome is known: from here on the time-limit signal (USR2) is ignored, so that submitit's handler
        # (it raises or exits) cuts short neither the attempt's record nor the decision below; the record would be
        # lost and a finished run would end FAILED. The decision below requeues an unfinished run itself.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        if job.global_rank == 0:
            record_attempt(Path(self.run_dir), job.job_id, job.num_tasks, status)
        if status == 0 or done.exists():  # finished is final, whatever ended the process after done.json
            return json.loads(done.read_text()) if job.global_rank == 0 else None
        if status == EXIT_DIVERGED:  # never requeued: it would resume from its last finite checkpoint and diverge
            return None
        if status == EXIT_PREEMPTED:  # preempted (SIGTERM) outside submitit's own USR2 path
            job_id = os.environ.get("SLURM_JOB_ID")
            if job.global_rank == 0 and job_id:
                state = slurm.state_of(job_id)
                if state is None or state == "CANCELLED":  # scancel: the user's decision stands
                    print(f"job {job_id}: {state or 'state unknown'}: not requeued", file=sys.stderr, flush=True)
                    return None
                subprocess.run(["scontrol", "requeue", job_id], check=False)
            time.sleep(300)  # SLURM ends this attempt; the requeued one resumes
            return None
        raise RuntimeError(f"trainer exited with status {status}; see the job's log in {self.run_dir}/slurm")

    def _wait_for_trainer(self) -> int:
        """The trainer's exit status. A thread reaps it, so that submitit's signal handler, which interrupts
        this (main) thread anywhere, never finds the process reaped but its status not yet stored."""
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._process.wait, daemon=True)
            self._reaper.start()
        while self._process.returncode is None:
            time.sleep(0.05)
        return self._process.returncode

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on rank 0 at the time limit: have the trainer checkpoint, then requeue; unless
        the run finished meanwhile (its done.json exists): then None, and submitit ends the job."""
        done = Path(self.run_dir) / "done.json"
        if self._process is not None:
            # A finished trainer (done.json written) is only exiting, and Python's shutdown restores the default
            # handlers: a signal then would kill it. It is waited for instead.
            if self._process.returncode is None and not done.exists():
                self._process.send_signal(signal.SIGUSR2)  # all ranks stop together at the next step
            job = submitit.JobEnvironment()
            record_attempt(Path(self.run_dir), job.job_id, job.num_tasks, self._wait_for_trainer())
        if done.exists():
            return None  # finished is final: never requeue a finished run
        return submitit.helpers.DelayedSubmission(self)


# -- on the login node -----------------------------------------------------------------------------------
def job_name(run_dir: Path) -> str:
    """The run's SLURM job name: the same for every submission of this directory, and only for it."""
    run_dir = Path(run_dir).resolve()
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:10]
    return f"sacglam-{run_dir.parent.name[:60]}-{run_dir.name}-{digest}"


def slurm_executor(run_dir: Path, launcher: LauncherConfig):
    """submitit's executor with the run's job options (the ones `sbatch --test-only` checks too)."""
    executor = submitit.AutoExecutor(
        folder=run_dir / "slurm", cluster="slurm", slurm_max_num_timeout=launcher.max_requeues
    )
    gpus = ":".join(filter(None, ["gpu", launcher.gres_type, str(launcher.gpus_per_node)]))
    options = {
        "name": job_name(run_dir),
        "timeout_min": launcher.time_min,
        "nodes": launcher.nodes,
        "tasks_per_node": launcher.ranks,
        "cpus_per_task": launcher.cpus_per_gpu,
        "mem_gb": launcher.mem_gb,
        "slurm_gres": gpus if launcher.gpus_per_node else None,
        "slurm_signal_delay_s": launcher.signal_delay_s,
        "slurm_partition": launcher.partition,
        "slurm_account": launcher.account,
        "slurm_qos": launcher.qos,
        "slurm_constraint": launcher.constraint,
        "slurm_setup": list(launcher.setup) or None,
        "slurm_additional_parameters": {**launcher.sbatch_options, "requeue": True},
    }
    executor.update_parameters(**{k: v for k, v in options.items() if v is not None})
    return executor


def submission_script(run_dir: Path, launcher: LauncherConfig) -> str:
    """The batch script submitit would submit for the run (its #SBATCH lines are the job's options)."""
    executor = slurm_executor(run_dir, launcher)
    return executor._executor._make_submission_file_text(executor._executor._submitit_command_str, "preflight")


def submit(run_dir: Path, launcher: LauncherConfig, command: TrainerCommand) -> str:
    """Submit the run's job; returns its SLURM job id."""
    job = slurm_executor(run_dir, launcher).submit(TrainingJob(str(run_dir), command))
    return str(job.job_id)


def run_locally(run_dir: Path, command: TrainerCommand, stop: threading.Event, log: Path) -> int:
    """The trainer as a local process; `stop` makes it checkpoint (SIGTERM) and return. Its exit status. Should this
    process die without a word (kill -9), the trainer checkpoints and stops on its own (--driver-pid)."""
    argv, env = command.process()
    if command.container is None:  # inside an image the trainer's parent is Apptainer's, not this process
        argv += ["--driver-pid", str(os.getpid())]
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, env=env, cwd=command.repository, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            if stop.wait(0.5):
                process.send_signal(signal.SIGTERM)  # the trainer checkpoints and exits with status 75
                process.wait()
    record_attempt(run_dir, f"local-{process.pid}", 1, process.returncode)
    return process.returncode
