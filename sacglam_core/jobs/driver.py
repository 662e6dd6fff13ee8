"""The login-node side of one Snakemake invocation, the driver: it submits runs, re-attaches to their jobs and
waits for them, all in Snakemake's own process (the `train` rule's `run:` executes in one of its threads).

- **One process, one poller.** Each planned run waits in a thread of Snakemake (`force-use-threads` in the
  profiles); a single poller asks SLURM about every job at once (one `squeue` per `launcher.poll_s`, `sacct`
  for the jobs that left the queue).
- **Finished is final.** A run whose done.json exists is never submitted again: its train job only writes
  the marker `train.done` (Snakemake's output; done.json is never one, so Snakemake never deletes it).
- **Jobs survive the driver.** Right after sbatch the job id goes to `<run>/job.json`. Before submitting,
  the driver re-attaches to the run's live job: the recorded id, else a queued job with the run's name (the
  window between sbatch and job.json), else the SLURM job of a trainer holding the run's lease.
- **Signals detach.** SIGHUP, SIGTERM and Ctrl-C make the waiting threads return at once without cancelling
  anything; the jobs keep running and the next invocation re-attaches. Cancelling is `scancel` (README).
  Under the local executor the runs are local processes: they checkpoint and stop; so do they when the driver
  is killed outright (kill -9: each trainer watches its parent), and the next invocation waits for any trainer
  still holding a run's lease before it resumes the run.
- **One driver per results folder.** An flock on `<results>/.driver/lease` (the run-lease mechanism), held
  while training is planned; it dies with the process, so a killed driver leaves nothing to unlock.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from sacglam_core import EXIT_PREEMPTED, runfiles
from sacglam_core.atomic import write_text
from sacglam_core.jobs import runstate, slurm
from sacglam_core.lease import LeaseHeldError, RunLease, holder, since
from sacglam_core.pipeline.config import WorkflowConfig
from sacglam_core.pipeline.experiments import Run

LAUNCH_FILE = "launch.json"  # <results>/.driver/: the settings files and --config of the campaign's last launch

DONE_LATENCY_S = 60  # how long done.json may take to appear on the login node after the job ended (NFS)


class Detached(KeyboardInterrupt):
    """The driver is stopping: a waiting train job returns at once (its SLURM job keeps running).
    A KeyboardInterrupt so that Snakemake, which is stopping too, drops it silently."""


class RunFailed(RuntimeError):
    """A run's job ended without finishing the run, or the run cannot be submitted; one line says why."""


class DriverError(RuntimeError):
    """The driver cannot start (another driver, a failed preflight); one line says why."""


def say(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass  # the terminal is gone (SIGHUP): the run's driver.log has it


class RunLog:
    """`<run>/driver.log`, the train rule's log: what the driver did for the run in this invocation (submitted,
    re-attached, the job's end); Snakemake empties it when the job starts. `job.json` keeps the job's id."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, message: str, echo: bool = True) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(f"{datetime.now():%Y-%m-%d %H:%M:%S} {message}\n")
        if echo:
            say(f"{self.path.parent}: {message}")


class JobWatcher:
    """One poller for every job the driver waits on: one `squeue` per interval, `sacct` for jobs that left."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._changed = threading.Condition()
        self._watched: set[str] = set()
        self._ended: dict[str, str] = {}
        self._snapshot: tuple[float, dict[str, tuple[str, str]]] = (float("-inf"), {})
        self._snapshot_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def queue(self, max_age_s: float = 2.0) -> dict[str, tuple[str, str]]:
        """This user's queue (job id -> (state, name)), at most `max_age_s` old: threads share one squeue."""
        with self._snapshot_lock:
            taken, jobs = self._snapshot
            if time.monotonic() - taken > max_age_s:
                jobs = slurm.queue()
                self.polls += 1
                self._snapshot = (time.monotonic(), jobs)
            return jobs

    def wait(self, job_id: str, stop: threading.Event) -> str:
        """Block until the job leaves the queue; its final state (FAILED, CANCELLED... or ENDED if unknown)."""
        with self._changed:
            self._watched.add(job_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="slurm-poller", daemon=True)
                self._thread.start()
            while job_id not in self._ended:
                if stop.is_set():
                    self._watched.discard(job_id)
                    raise Detached()
                self._changed.wait(timeout=0.5)
            self._watched.discard(job_id)
            return self._ended.pop(job_id)

    def _poll(self) -> None:
        lingering: dict[str, int] = {}  # ended in squeue, still live in (lagging) accounting: rounds seen
        while True:
            time.sleep(self.interval_s)
            with self._changed:
                watched = set(self._watched)
            if not watched:
                continue
            try:
                jobs = self.queue(max_age_s=self.interval_s / 2)
                gone = sorted(j for j in watched if j not in jobs or jobs[j][0] not in slurm.LIVE)
                finals = slurm.final_states(gone)
            except slurm.SlurmError as error:
                say(f"driver: cannot poll SLURM ({error}); trying again in {self.interval_s:g} s")
                continue
            ended = {}
            for job_id in gone:
                state = finals.get(job_id) or (jobs[job_id][0] if job_id in jobs else "ENDED")
                if state in slurm.LIVE and lingering.get(job_id, 0) < 5:
                    lingering[job_id] = lingering.get(job_id, 0) + 1
                    continue
                ended[job_id] = state if state not in slurm.LIVE else "ENDED"
            if ended:
                with self._changed:
                    self._ended.update(ended)
                    self._changed.notify_all()


class Driver:
    def __init__(self, settings: WorkflowConfig, repository: Path | None = None, launch: dict | None = None) -> None:
        self.settings = settings
        self.launch = launch or {}  # the settings files and --config the campaign was launched with
        self.launcher = settings.launcher
        self.results = Path(settings.results)
        self.repository = repository or Path.cwd()
        self.stop = threading.Event()
        self.session = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # this invocation
        self.watcher = JobWatcher(self.launcher.poll_s)
        self._lease: RunLease | None = None

    @property
    def on_slurm(self) -> bool:
        return self.launcher.executor == "slurm"

    # -- start (Snakemake's onstart) -----------------------------------------------------------------
    def start(self, training: bool) -> None:
        """Take the results folder when training is planned, then let signals detach (never cancel)."""
        if training:
            self.lock()
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def lock(self) -> None:
        directory = self.results / ".driver"
        lease = RunLease(directory)
        try:
            lease.acquire()
        except LeaseHeldError:
            other = holder(directory) or {}
            stopping = (
                "its SLURM jobs keep running and this command re-attaches to them"
                if self.on_slurm
                else "its trainers checkpoint and stop, and this command resumes them"
            )
            raise DriverError(
                f"another Snakemake drives {self.results} (pid {other.get('pid')} on {other.get('host')}, since "
                f"{since(other, '%Y-%m-%d %H:%M')}); wait for it, or stop it (kill {other.get('pid')}: {stopping})"
            ) from None
        self._lease = lease
        write_text(directory / LAUNCH_FILE, json.dumps(self.launch, indent=1, default=str))

    def _on_signal(self, signum: int, frame) -> None:
        if not self.stop.is_set():
            self.stop.set()
            name = signal.Signals(signum).name
            if self.on_slurm:
                say(
                    f"driver: {name}: detaching; the SLURM jobs keep running and the same command re-attaches to "
                    f"them (to cancel them: scancel --name=<job name in <run>/job.json>, see README)"
                )
            else:
                say(f"driver: {name}: the runs checkpoint and stop; the same command resumes them")
        raise KeyboardInterrupt  # Snakemake's own Ctrl-C path: it stops scheduling and waits for the threads

    # -- one run (the train rule's `run:`, in a thread) -----------------------------------------------
    def train(self, run: Run, marker: Path, log: Path) -> None:
        """Make sure `run` is finished (submit, re-attach, or nothing to do), then write Snakemake's marker."""
        note = RunLog(Path(log))
        if self.stop.is_set():
            raise Detached()
        summary = runfiles.finished(run.directory)
        if summary is None:
            self._refuse_diverged(run)
            run.directory.mkdir(parents=True, exist_ok=True)
            write_text(run.directory / "run.yaml", _yaml({**run.settings, "monitor": asdict(self.settings.monitor)}))
            (self._on_slurm if self.on_slurm else self._locally)(run, note)
            summary = self._await_done(run)
        elif not Path(marker).exists():
            note("finished earlier (done.json): nothing to submit")
        fingerprint = run.config.fingerprint
        if summary.get("fingerprint") not in (None, fingerprint):
            note(
                f"warning: finished with configuration fingerprint {summary['fingerprint']}, the current code gives "
                f"{fingerprint} (defaults changed?); kept: finished is final. To retrain it, move the directory aside"
            )
        write_text(
            marker, json.dumps({"fingerprint": summary.get("fingerprint"), "env_steps": summary.get("env_steps")})
        )

    def _on_slurm(self, run: Run, note: RunLog) -> None:
        job_id = self._attach(run, note) or self._submit(run, note)
        state = self.watcher.wait(job_id, self.stop)
        if runfiles.finished(run.directory) is None and state != "CANCELLED":
            self._await_done(run, patience_s=DONE_LATENCY_S, quiet=True)
        if runfiles.finished(run.directory) is not None:
            note(f"job {job_id} ended {state}: the run is finished")
            return
        self._refuse_diverged(run)
        runstate.write_job(run.directory, {**(runstate.read_job(run.directory) or {"job_id": job_id}),
                                           "ended": state, "ended_in": self.session})  # fmt: skip
        if state == "CANCELLED":
            raise RunFailed(
                f"{run.directory}: SLURM job {job_id} was cancelled; not submitted again by this invocation (the "
                f"next one resumes it from its last checkpoint)"
            )
        raise RunFailed(
            f"{run.directory}: SLURM job {job_id} ended {state} before the run finished; its log: "
            f"{run.directory}/slurm/{job_id}_0_log.err (a retry resumes from the last checkpoint)"
        )

    def _attach(self, run: Run, note: RunLog) -> str | None:
        """The id of the run's live job, if it has one: recorded, found by name, or the lease holder's."""
        from sacglam_core.jobs.launch import job_name

        record = runstate.read_job(run.directory)
        if record and record.get("ended") == "CANCELLED" and record.get("ended_in") == self.session:
            raise RunFailed(f"{run.directory}: its job {record['job_id']} was cancelled during this invocation")
        queue = self.watcher.queue()
        if record and queue.get(str(record["job_id"]), ("",))[0] in slurm.LIVE:
            note(f"re-attached to job {record['job_id']} ({queue[str(record['job_id'])][0]})")
            return str(record["job_id"])
        name = job_name(run.directory)
        named = sorted((j for j, (state, n) in queue.items() if n == name and state in slurm.LIVE), key=int)
        found = "found by its name; it was not recorded yet"
        trainer = holder(run.directory)
        if not named and trainer and trainer.get("slurm_job_id"):
            named, found = [str(trainer["slurm_job_id"])], "its trainer holds the run's lease"
        elif not named and trainer is not None:
            raise RunFailed(
                f"{run.directory} is in use by pid {trainer.get('pid')} on {trainer.get('host')}, not a SLURM job of "
                f"this workflow; not submitting a second writer"
            )
        if not named:
            return None
        record = {"job_id": named[0], "name": name, "found": time.time(), "driver": self.session}
        runstate.write_job(run.directory, record)
        note(f"re-attached to job {named[0]} ({found})")
        return named[0]

    def _submit(self, run: Run, note: RunLog) -> str:
        from sacglam_core.jobs.launch import job_name, submit

        job_id = submit(run.directory, self.launcher, self._command(run))
        runstate.write_job(run.directory, {"job_id": job_id, "name": job_name(run.directory), "submitted": time.time(),
                                           "driver": self.session})  # fmt: skip
        note(f"submitted job {job_id}")
        return job_id

    def _locally(self, run: Run, note: RunLog) -> None:
        from sacglam_core.jobs.launch import run_locally

        self._wait_for_holder(run, note)
        if runfiles.finished(run.directory) is not None:
            note("finished by the trainer that held it: nothing to start")
            return
        progress = runfiles.progress(run.directory)
        start = f"its checkpoint at {progress.steps:,} steps" if progress else "the start"
        note(f"trainer started locally, from {start}", echo=False)
        status = run_locally(run.directory, self._command(run), self.stop, run.directory / "trainer.log")
        if status == EXIT_PREEMPTED and self.stop.is_set():
            raise Detached()
        self._refuse_diverged(run)
        if status != 0:
            raise RunFailed(
                f"{run.directory}: the trainer exited with status {status}; see {run.directory}/trainer.log"
            )

    @staticmethod
    def _refuse_diverged(run: Run) -> None:
        """A run whose training diverged is not trained again: it would resume from its last finite checkpoint and
        diverge again, at the same cost."""
        record = runfiles.diverged(run.directory)
        if record is not None:
            raise RunFailed(
                f"{run.directory}: {record['message']}. Not trained again while {runfiles.DIVERGED} is there: change "
                f"the variant's settings (a new run; docs/trainer.md says what), or delete it to try again"
            )

    def _wait_for_holder(self, run: Run, note: RunLog) -> None:
        """Wait while another process holds the run's lease: a trainer of an earlier invocation (a killed driver's
        trainer checkpoints and stops within seconds) or one started by hand; starting a second one would only be
        refused by the lease."""
        waiting = None
        while (trainer := holder(run.directory)) is not None:
            if self.stop.is_set():
                raise Detached()
            if trainer.get("pid") != waiting:
                waiting = trainer.get("pid")
                note(f"waiting for pid {waiting} on {trainer.get('host')}, which holds the run's lease, to end")
            time.sleep(1)

    def _command(self, run: Run):
        from sacglam_core.jobs.launch import trainer_command

        settings = self.settings
        # One compile cache for the campaign's jobs (`model.compile`): a shape compiles once, not once per job.
        cache = Path(settings.results).resolve() / ".compile-cache"
        environment = {
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_CACHE": str(Path(settings.hf_cache).resolve()),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
        }
        data = [Path(settings.results), Path(settings.models), Path(settings.hf_cache)]
        return trainer_command(run.directory, self.launcher, self.repository, data, environment)

    def _await_done(self, run: Run, patience_s: float = 0, quiet: bool = False) -> dict:
        deadline = time.monotonic() + patience_s
        while True:
            summary = runfiles.finished(run.directory)
            if summary is not None or time.monotonic() >= deadline:
                break
            time.sleep(1)
        if summary is None and not quiet:
            raise RunFailed(f"{run.directory}: the job ended but done.json is missing")
        return summary or {}


def _yaml(settings: dict) -> str:
    import yaml

    return yaml.safe_dump(settings, sort_keys=False)
