"""Launch one training run through submitit: a SLURM job (or a local process) that runs the trainer,
inside the Apptainer image when one is configured, with one task (one rank) per GPU.

On SLURM's time-limit signal (USR2) or a preemption (TERM) the trainer checkpoints and exits with
status 75; the job then requeues itself and the next attempt resumes from the checkpoint. Every
attempt appends a line to `<run>/attempts.jsonl` (job id, restart count, visible GPUs, exit status).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import submitit

from sacglam_core import EXIT_PREEMPTED
from sacglam_core.pipeline.config import LauncherConfig


class TrainingJob(submitit.helpers.Checkpointable):
    """The callable submitit runs in every task of the job: one trainer process (one rank) per task."""

    def __init__(self, run_dir: str, command: list[str], environment: dict[str, str]) -> None:
        self.run_dir, self.command, self.environment = run_dir, command, environment
        self._process: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_process"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _process=None)

    def __call__(self) -> dict | None:
        env = {**os.environ, **self.environment}
        job = submitit.JobEnvironment()
        if job.num_tasks > 1:
            distributed = submitit.helpers.TorchDistributedEnvironment()
            env |= {"MASTER_ADDR": distributed.master_addr, "MASTER_PORT": str(distributed.master_port),
                    "RANK": str(distributed.rank), "WORLD_SIZE": str(distributed.world_size),
                    "LOCAL_RANK": str(distributed.local_rank)}  # fmt: skip
        self._process = subprocess.Popen(self.command, env=env)
        status = self._process.wait()
        self._record(job, status)
        if status == 0:
            return json.loads((Path(self.run_dir) / "done.json").read_text()) if job.global_rank == 0 else None
        if status == EXIT_PREEMPTED:  # preempted (SIGTERM) outside submitit's own USR2 path: requeue
            if job.global_rank == 0 and "SLURM_JOB_ID" in os.environ:
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
            time.sleep(300)  # SLURM ends this attempt; the requeued one resumes
            return None
        raise RuntimeError(f"trainer exited with status {status}; see the job's log in {self.run_dir}/slurm")

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on rank 0 at the time limit: have the trainer checkpoint, then requeue."""
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGUSR2)  # all ranks stop together at the next step
            # Not Popen.wait(): this runs in a signal handler that interrupted Popen.wait() in __call__,
            # which holds the (non-reentrant) lock that wait() takes.
            try:
                _, status = os.waitpid(self._process.pid, 0)
                self._record(submitit.JobEnvironment(), os.waitstatus_to_exitcode(status))
            except ChildProcessError:
                pass  # already reaped
        return submitit.helpers.DelayedSubmission(self)

    def _record(self, job: submitit.JobEnvironment, status: int) -> None:
        if job.global_rank != 0:
            return
        attempt = {
            "job_id": job.job_id,
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            "host": socket.gethostname(),
            "tasks": job.num_tasks,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "exit_status": status,
            "time": time.time(),
        }
        with open(Path(self.run_dir) / "attempts.jsonl", "a") as f:
            f.write(json.dumps(attempt) + "\n")


def trainer_command(run_config: Path, launcher: LauncherConfig, repository: Path) -> list[str]:
    train = ["-m", "sacglam_core.train", "--config", str(run_config)]
    if launcher.container is None:
        return [sys.executable, *train]
    binds = ",".join([str(repository), *launcher.binds])
    return ["apptainer", "exec", "--nv", "--bind", binds, launcher.container, "python", *train]


def make_executor(run_dir: Path, launcher: LauncherConfig, job_name: str) -> submitit.Executor:
    folder = run_dir / "slurm"
    if launcher.executor == "local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(timeout_min=launcher.time_min, name=job_name)
        return executor
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=launcher.max_requeues)
    options = {
        "name": job_name,
        "timeout_min": launcher.time_min,
        "nodes": 1,
        "tasks_per_node": max(launcher.gpus_per_node, 1),
        "cpus_per_task": launcher.cpus_per_gpu,
        "mem_gb": launcher.mem_gb,
        "slurm_gres": f"gpu:{launcher.gpus_per_node}" if launcher.gpus_per_node else None,
        "slurm_signal_delay_s": launcher.signal_delay_s,
        "slurm_partition": launcher.partition,
        "slurm_account": launcher.account,
        "slurm_qos": launcher.qos,
        "slurm_constraint": launcher.constraint,
        "slurm_additional_parameters": {"requeue": True},
    }
    executor.update_parameters(**{k: v for k, v in options.items() if v is not None})
    return executor


def launch(
    run_dir: Path, launcher: LauncherConfig, repository: Path, environment: dict[str, str] | None = None
) -> dict:
    """Submit the run in `run_dir` (its `run.yaml` is written) and wait for it; returns its done.json."""
    env = {"PYTHONUNBUFFERED": "1", **(launcher.environment or {}), **(environment or {})}
    if launcher.threads_per_task:
        env |= {"OMP_NUM_THREADS": str(launcher.threads_per_task), "MKL_NUM_THREADS": str(launcher.threads_per_task)}
    job_name = "sacglam-" + "-".join(run_dir.parts[-3:])
    executor = make_executor(run_dir, launcher, job_name)
    job = executor.submit(TrainingJob(str(run_dir), trainer_command(run_dir / "run.yaml", launcher, repository), env))
    print(f"submitted {run_dir} as job {job.job_id}", file=sys.stderr, flush=True)

    def cancel(signum, frame):  # Ctrl-C or Snakemake stopping: the job checkpoints (SIGTERM) and ends
        job.cancel(check=False)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, cancel)
    signal.signal(signal.SIGTERM, cancel)
    return job.results()[0]  # one result per task; rank 0's is the run's
