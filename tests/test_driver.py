"""The driver's decisions against a scripted SLURM (the real one: tests/test_slurm_integration.py): finished runs are
never submitted, live jobs are re-attached to, a cancelled job is not resubmitted by the same invocation, signals
detach, one driver per results folder, one squeue for all waiting runs; the trainer's command in the image."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sacglam_core import EXIT_PREEMPTED, runfiles
from sacglam_core.device_plan import local_gpu
from sacglam_core.jobs import driver as driving
from sacglam_core.jobs import launch, runstate, slurm
from sacglam_core.lease import RunLease
from sacglam_core.pipeline.config import parse_workflow_config
from sacglam_core.pipeline.experiments import expand, load_definitions

ROOT = Path(__file__).resolve().parents[1]


class FakeSlurm:
    """squeue/sacct/sbatch as scripted: `queue` maps job id -> (state, name); submissions get new ids."""

    def __init__(self, monkeypatch):
        self.queue: dict[str, tuple[str, str]] = {}
        self.final: dict[str, str] = {}
        self.submitted: list[Path] = []
        self.squeue_calls = 0
        monkeypatch.setattr(slurm, "queue", self._queue)
        monkeypatch.setattr(slurm, "final_states", lambda ids: {i: self.final[i] for i in ids if i in self.final})
        monkeypatch.setattr(launch, "submit", self._submit)

    def _queue(self):
        self.squeue_calls += 1
        return dict(self.queue)

    def _submit(self, run_dir, launcher, command):
        self.submitted.append(run_dir)
        job_id = str(100 + len(self.submitted))
        self.queue[job_id] = ("PENDING", launch.job_name(run_dir))
        return job_id

    def end(self, job_id: str, state: str, run_dir: Path | None = None) -> None:
        """The job leaves the queue; with `run_dir`, as a finished run."""
        if run_dir is not None:
            (run_dir / "done.json").write_text(json.dumps({"env_steps": 1024, "fingerprint": None}))
        self.queue.pop(job_id, None)
        self.final[job_id] = state


@pytest.fixture(autouse=True)
def _restore_usr2():
    """A job that has run its trainer ignores SIGUSR2 from then on (here: in pytest's process): restore it."""
    previous = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, previous)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    settings = parse_workflow_config(
        {
            "experiments": ["smoke"],
            "results": str(tmp_path / "results"),
            "launcher": {"partition": "debug", "poll_s": 0.05},
        }
    )
    definitions = load_definitions(ROOT / "workflow/config/experiments.yaml")
    runs = expand(definitions, ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})
    monkeypatch.setattr(driving, "DONE_LATENCY_S", 0)
    return settings, runs, FakeSlurm(monkeypatch)


def train_in_thread(driver, run):
    errors = []

    def target():
        try:
            driver.train(run, run.directory / runfiles.MARKER, run.directory / "driver.log")
        except BaseException as error:  # noqa: BLE001 (reported to the test)
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, errors


def wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_finished_run_is_never_submitted(setup):
    settings, runs, fake = setup
    run = runs[0]
    run.directory.mkdir(parents=True)
    (run.directory / "done.json").write_text(json.dumps({"env_steps": 1024, "fingerprint": "elsewhere"}))
    driving.Driver(settings).train(run, run.directory / runfiles.MARKER, run.directory / "driver.log")
    assert fake.submitted == [] and (run.directory / runfiles.MARKER).exists()
    log = (run.directory / "driver.log").read_text()
    assert "finished earlier (done.json): nothing to submit" in log and "kept: finished is final" in log


def test_submit_record_and_finish(setup):
    settings, runs, fake = setup
    run = runs[0]
    thread, errors = train_in_thread(driving.Driver(settings), run)
    wait_for(lambda: runstate.read_job(run.directory) is not None)
    record = runstate.read_job(run.directory)
    assert fake.submitted == [run.directory] and record["name"] == launch.job_name(run.directory)
    # the run's configuration, written before submitting, with the workflow's monitoring
    assert yaml_settings(run) == {**run.settings, "monitor": dataclasses.asdict(settings.monitor)}
    fake.end(record["job_id"], "COMPLETED", run.directory)
    thread.join(10)
    assert not errors and (run.directory / runfiles.MARKER).exists()


def yaml_settings(run):
    import yaml

    return yaml.safe_load((run.directory / "run.yaml").read_text())


@pytest.mark.parametrize("how", ["recorded", "by name", "lease"])
def test_a_live_job_is_re_attached_to_not_submitted_again(setup, how):
    settings, runs, fake = setup
    run = runs[0]
    run.directory.mkdir(parents=True)
    fake.queue["77"] = ("RUNNING", launch.job_name(run.directory) if how != "lease" else "renamed by hand")
    if how == "recorded":
        runstate.write_job(run.directory, {"job_id": "77"})
    lease = RunLease(run.directory)
    if how == "lease":  # a trainer of job 77 holds the run directory (its lease)
        os.environ["SLURM_JOB_ID"] = "77"
        try:
            lease.acquire()
        finally:
            del os.environ["SLURM_JOB_ID"]
    thread, errors = train_in_thread(driving.Driver(settings), run)
    wait_for(
        lambda: (
            "re-attached to job 77" in (run.directory / "driver.log").read_text()
            if (run.directory / "driver.log").exists()
            else False
        )
    )
    lease.release()
    fake.end("77", "COMPLETED", run.directory)
    thread.join(10)
    assert not errors and fake.submitted == [] and runstate.read_job(run.directory)["job_id"] == "77"


def test_a_trainer_that_is_not_a_job_blocks_a_second_writer(setup):
    settings, runs, fake = setup
    run = runs[0]
    with RunLease(run.directory):
        with pytest.raises(driving.RunFailed, match="is in use by pid .* not submitting a second writer"):
            driving.Driver(settings).train(run, run.directory / runfiles.MARKER, run.directory / "driver.log")
    assert fake.submitted == []


def test_a_cancelled_job_is_not_resubmitted_by_the_same_invocation(setup):
    settings, runs, fake = setup
    run = runs[0]
    driver = driving.Driver(settings)
    thread, errors = train_in_thread(driver, run)
    wait_for(lambda: runstate.read_job(run.directory) is not None)
    fake.end(runstate.read_job(run.directory)["job_id"], "CANCELLED")  # the user's scancel
    thread.join(10)
    assert "was cancelled; not submitted again by this invocation" in str(errors[0])
    with pytest.raises(driving.RunFailed, match="was cancelled during this invocation"):  # Snakemake's retry
        driver.train(run, run.directory / runfiles.MARKER, run.directory / "driver.log")
    assert len(fake.submitted) == 1
    thread, errors = train_in_thread(driving.Driver(settings), run)  # the next invocation resumes it
    wait_for(lambda: len(fake.submitted) == 2)
    fake.end(runstate.read_job(run.directory)["job_id"], "COMPLETED", run.directory)
    thread.join(10)
    assert not errors


def test_a_failed_job_says_where_its_log_is(setup):
    settings, runs, fake = setup
    run = runs[0]
    thread, errors = train_in_thread(driving.Driver(settings), run)
    wait_for(lambda: runstate.read_job(run.directory) is not None)
    fake.end("101", "NODE_FAIL")
    thread.join(10)
    assert f"job 101 ended NODE_FAIL before the run finished; its log: {run.directory}/slurm/101_0_log.err" in str(
        errors[0]
    )


def test_one_poll_for_every_waiting_run(setup):
    settings, runs, fake = setup
    many = [runs[0].__class__(r.experiment, r.variant, r.seed, r.directory.parent / f"seed{i}", r.settings)
            for i, r in enumerate(runs * 10)]  # fmt: skip
    driver = driving.Driver(settings)
    threads = [train_in_thread(driver, run) for run in many]
    wait_for(lambda: len(fake.submitted) == len(many))
    time.sleep(0.5)  # ten poll intervals of 0.05 s
    calls_while_waiting = fake.squeue_calls
    assert calls_while_waiting < 30, calls_while_waiting  # one squeue per interval, not one per run
    for run in many:
        fake.end(runstate.read_job(run.directory)["job_id"], "COMPLETED", run.directory)
    for thread, errors in threads:
        thread.join(10)
        assert not errors


def test_signals_detach_without_cancelling(setup):
    settings, runs, fake = setup
    driver = driving.Driver(settings)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        driver.start(training=False)
        thread, errors = train_in_thread(driver, runs[0])
        wait_for(lambda: len(fake.submitted) == 1)
        with pytest.raises(KeyboardInterrupt):  # Snakemake's own stop path
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)
        thread.join(5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert isinstance(errors[0], driving.Detached) and driver.stop.is_set()
    assert list(fake.queue) == ["101"]  # the job was left alone: nothing cancelled it


def test_one_driver_per_results_folder(setup):
    settings, _, _ = setup
    first = driving.Driver(settings)
    first.start(training=True)
    try:
        with pytest.raises(driving.DriverError, match=f"another Snakemake drives .* \\(pid {os.getpid()} on "):
            driving.Driver(settings).lock()
    finally:
        first._lease.release()
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


@pytest.mark.parametrize("executor, stopping", [
    ("slurm", "its SLURM jobs keep running and this command re-attaches to them"),
    ("local", "its trainers checkpoint and stop, and this command resumes them"),
])  # fmt: skip
def test_a_second_driver_is_told_what_stopping_the_first_does(tmp_path, executor, stopping):
    settings = parse_workflow_config(
        {"experiments": ["smoke"], "results": str(tmp_path / "results"), "launcher": {"executor": executor}}
    )
    first = driving.Driver(settings)
    first.lock()
    try:
        with pytest.raises(driving.DriverError) as refused:
            driving.Driver(settings).lock()
        assert str(refused.value).endswith(f"(kill {os.getpid()}: {stopping})")
    finally:
        first._lease.release()


HOLD_THEN_MAYBE_FINISH = """
import json, sys, time
from pathlib import Path
from sacglam_core.lease import RunLease
lease = RunLease(sys.argv[1])
lease.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "finish":
    (Path(sys.argv[1]) / "done.json").write_text(json.dumps({"env_steps": 1024, "fingerprint": None}))
"""


@pytest.mark.parametrize("outcome", ["stops", "finish"])
def test_a_local_run_held_by_an_earlier_trainer_is_waited_for_not_started_twice(setup, monkeypatch, outcome):
    """A trainer left by a killed driver (or started by hand) holds the run's lease: the local driver waits for it
    to end, then resumes the run, or finds it finished; it never starts a second trainer that the lease refuses."""
    settings, runs, _ = setup
    settings = parse_workflow_config(
        {"experiments": ["smoke"], "results": settings.results, "launcher": {"executor": "local"}}
    )
    run = runs[0]
    started = []

    def trainer(run_dir, command, stop, log):
        started.append(time.monotonic())
        (run_dir / "done.json").write_text(json.dumps({"env_steps": 1024, "fingerprint": None}))
        return 0

    monkeypatch.setattr(launch, "run_locally", trainer)
    earlier = subprocess.Popen(
        [sys.executable, "-c", HOLD_THEN_MAYBE_FINISH, str(run.directory), "2", outcome],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert earlier.stdout.readline().strip() == "held"
    thread, errors = train_in_thread(driving.Driver(settings), run)
    thread.join(30)
    ended = time.monotonic()
    assert earlier.wait(1) == 0 and not errors and (run.directory / runfiles.MARKER).exists()
    log = (run.directory / "driver.log").read_text()
    assert f"waiting for pid {earlier.pid} on " in log and "which holds the run's lease, to end" in log
    if outcome == "finish":
        assert started == [] and "finished by the trainer that held it: nothing to start" in log
    else:
        assert len(started) == 1 and started[0] <= ended and "trainer started locally, from the start" in log


def test_the_trainer_runs_the_repositorys_code_in_a_clean_environment(tmp_path, monkeypatch):
    settings = parse_workflow_config(
        {"experiments": ["main"], "launcher": {"container": "image.sif", "binds": ["/opt"]}}
    )
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("PYTHONPATH", "/home/user/.local/lib")
    monkeypatch.setenv("SECRET_TOKEN", "x")
    command = launch.trainer_command(
        results / "run", settings.launcher, ROOT, [results, ROOT / "resources"], {"A": "1"}
    )
    argv, env = command.process({"RANK": "3"})
    assert argv[:6] == ["apptainer", "exec", "--nv", "--cleanenv", "--pwd", str(ROOT)]
    assert argv[argv.index("--bind") + 1] == f"{ROOT},{results},/opt"  # results outside the repository are bound
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "--env"}
    assert {f"PYTHONPATH={ROOT}", "PYTHONNOUSERSITE=1", "RANK=3", "SLURM_JOB_ID=42", "A=1"} <= passed
    assert not any(p.startswith("SECRET_TOKEN") for p in passed)
    assert argv[-5:] == ["python", "-m", "sacglam_core.train", "--config", str(results / "run" / "run.yaml")]
    plain, plain_env = launch.trainer_command(results / "run", parse_workflow_config({"experiments": []}).launcher,
                                              ROOT, [], {}).process()  # fmt: skip
    assert plain_env["PYTHONPATH"] == str(ROOT) and plain_env["PYTHONNOUSERSITE"] == "1"


def test_job_names_are_one_per_run_directory(tmp_path):
    a, b = tmp_path / "x" / "exp" / "v-1" / "seed0", tmp_path / "y" / "exp" / "v-1" / "seed0"
    assert launch.job_name(a) == launch.job_name(a) != launch.job_name(b)
    assert launch.job_name(a).startswith("sacglam-v-1-seed0-")


def test_the_gpu_index_works_whether_a_task_sees_all_gpus_or_one():
    assert [local_gpu(rank, 4) for rank in range(4)] == [0, 1, 2, 3]  # --gres=gpu:4, every task sees 4
    assert [local_gpu(rank, 1) for rank in range(4)] == [0, 0, 0, 0]  # --gpus-per-task=1


def in_slurm_task(monkeypatch) -> None:
    """This process becomes task 0 of a one-task SLURM job 9, as submitit reads it."""
    for name, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "9", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1",
                        "SLURM_JOB_NODELIST": "localhost"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def trainer_is(monkeypatch, script: str) -> None:
    """The job's trainer becomes `python -c script`."""
    monkeypatch.setattr(launch.TrainerCommand, "process", lambda self, extra=None: (
        [sys.executable, "-c", script], dict(os.environ)))  # fmt: skip


@pytest.mark.parametrize("state, requeued", [("RUNNING", True), ("CANCELLED", False), (None, False)])
def test_a_cancelled_job_is_never_requeued(tmp_path, monkeypatch, state, requeued):
    """After SIGTERM the trainer exits 75; rank 0 requeues the job unless SLURM cancelled it (scancel)."""
    in_slurm_task(monkeypatch)
    calls = []
    monkeypatch.setattr(slurm, "state_of", lambda job_id: state)
    monkeypatch.setattr(launch.subprocess, "run", lambda args, **kw: calls.append(args))
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    trainer_is(monkeypatch, f"raise SystemExit({EXIT_PREEMPTED})")
    job = launch.TrainingJob(str(tmp_path), launch.TrainerCommand("run.yaml", str(tmp_path)))
    assert job() is None
    assert (calls == [["scontrol", "requeue", "9"]]) is requeued
    assert json.loads((tmp_path / "attempts.jsonl").read_text())["exit_status"] == EXIT_PREEMPTED


def test_a_finished_run_is_never_requeued_at_the_time_limit(tmp_path, monkeypatch):
    """SLURM's time-limit signal can come after the trainer finished (done.json written) but before the job ended;
    and an attempt that finds the run finished starts no trainer."""
    job = launch.TrainingJob(str(tmp_path), launch.TrainerCommand("run.yaml", str(tmp_path)))
    assert job.checkpoint() is not None  # unfinished: requeued, resumes from its checkpoint
    (tmp_path / "done.json").write_text('{"env_steps": 1024}')
    assert job.checkpoint() is None  # finished: submitit ends the job instead of requeuing it
    in_slurm_task(monkeypatch)
    monkeypatch.setattr(launch.subprocess, "Popen", None)  # no trainer may start
    assert job() == {"env_steps": 1024}


def test_a_finished_trainer_still_exiting_gets_no_time_limit_signal(tmp_path, monkeypatch):
    """Once done.json exists the trainer is only exiting, and Python's shutdown restores the default handlers:
    SIGUSR2 then would kill it (-12, seen on the real cluster under load). The job waits for its exit instead."""
    in_slurm_task(monkeypatch)
    (tmp_path / "done.json").write_text('{"env_steps": 1024}')
    job = launch.TrainingJob(str(tmp_path), launch.TrainerCommand("run.yaml", str(tmp_path)))
    # a process with default signal dispositions that is still exiting
    job._process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    assert job.checkpoint() is None
    assert json.loads((tmp_path / "attempts.jsonl").read_text())["exit_status"] == 0


def test_a_trainer_killed_after_it_finished_still_ends_its_job_as_finished(tmp_path, monkeypatch):
    """Whatever ends the trainer after done.json is written (a signal while it exits), the run is finished: the
    job returns its summary instead of failing, and the attempt records how the process ended."""
    in_slurm_task(monkeypatch)
    script = f"import os, signal, pathlib; pathlib.Path({str(tmp_path / 'done.json')!r}).write_text('{{}}'); "
    script += "os.kill(os.getpid(), signal.SIGUSR2)"
    trainer_is(monkeypatch, script)
    job = launch.TrainingJob(str(tmp_path), launch.TrainerCommand("run.yaml", str(tmp_path)))
    assert job() == {}
    assert json.loads((tmp_path / "attempts.jsonl").read_text())["exit_status"] == -signal.SIGUSR2


def test_the_time_limit_signal_as_a_finished_attempt_is_recorded_neither_loses_the_record_nor_fails_the_job(
    tmp_path, monkeypatch
):
    """SLURM's USR2 can land once the trainer has exited, while the job records the attempt (CI lost the record
    of a finished run this way: submitit's handler raised inside the job). The attempt is recorded and the job
    returns the run's summary; the handler is submitit's own."""
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import DelayedSubmission, JobPaths

    in_slurm_task(monkeypatch)
    script = f"import pathlib; pathlib.Path({str(tmp_path / 'done.json')!r}).write_text('{{\"env_steps\": 8}}')"
    trainer_is(monkeypatch, script)
    record = launch.record_attempt

    def record_as_the_signal_lands(*args):
        os.kill(os.getpid(), signal.SIGUSR2)
        record(*args)

    monkeypatch.setattr(launch, "record_attempt", record_as_the_signal_lands)
    job = launch.TrainingJob(str(tmp_path), launch.TrainerCommand("run.yaml", str(tmp_path)))
    delayed = DelayedSubmission(job)
    handler = SignalHandler(launch.submitit.JobEnvironment(), JobPaths(tmp_path / "slurm", "9"), delayed)
    signal.signal(signal.SIGUSR2, handler.checkpoint_and_try_requeue)
    assert job() == {"env_steps": 8}
    assert [json.loads(line)["exit_status"] for line in (tmp_path / "attempts.jsonl").read_text().splitlines()] == [0]


def test_taking_the_results_folder_records_what_the_campaign_was_launched_with(setup):
    """`status` without --profile reads it (tests/test_status.py)."""
    settings, _, _ = setup
    launch = {"configfiles": ["/a/workflow.yaml", "/b/cluster.yaml"], "config": {"experiments": ["main"]}}
    driver = driving.Driver(settings, launch=launch)
    driver.lock()
    try:
        recorded = json.loads((Path(settings.results) / ".driver" / driving.LAUNCH_FILE).read_text())
        assert recorded == launch
    finally:
        driver._lease.release()
