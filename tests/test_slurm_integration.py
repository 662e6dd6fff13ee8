"""The workflow on a real single-node SLURM cluster (tests/slurm_cluster.sh): every run is an sbatch
job through submitit with 4 (fake) GPUs and 4 ranks. One is killed by its time limit, requeued and finishes from
its checkpoint; the driver is stopped (SIGTERM) and killed (kill -9) while jobs run and re-attaches to them; a
finished campaign stays finished whatever is touched; `figures` and `--report` work mid-campaign; a bad partition is
refused before anything is submitted; a user's scancel is never undone. Run deliberately: `pytest -m slurm`."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import copy_cluster_profile

from sacglam_core.jobs import runstate
from sacglam_core.jobs.launch import job_name
from sacglam_core.pipeline.experiments import expand, load_definitions

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "slurm_cluster.sh"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
LAUNCHER = {
    "container": None,  # the test override: no Apptainer on this machine
    "partition": "debug",
    "constraint": None,
    "qos": None,
    "gpus_per_node": 4,
    "cpus_per_gpu": 1,
    "mem_gb": 2,
    "time_min": 10,
    "signal_delay_s": 45,
    "threads_per_task": 1,
    "poll_s": 2,
}


def slurm(*command: str, env: dict) -> str:
    return subprocess.run(["timeout", "30", *command], capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The test cluster's client environment; stopped afterwards only if this fixture started it."""
    state = os.environ.get("SLURM_TEST_DIR", "/tmp/sacglam-slurm")
    already_up = subprocess.run(["bash", str(SCRIPT), "status", state], capture_output=True).returncode == 0
    if not already_up:
        subprocess.run(["bash", str(SCRIPT), "start", state], check=True, timeout=900)
    exports = subprocess.run(["bash", str(SCRIPT), "env", state], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    env.update(re.findall(r"export (\w+)=(\S+)", exports))
    env["PYTHONPATH"] = str(ROOT)
    # A copy of profiles/slurm for this cluster, as a user makes one; Snakemake reads SNAKEMAKE_PROFILE.
    env["SNAKEMAKE_PROFILE"] = str(copy_cluster_profile(tmp_path_factory.mktemp("profile"), "testcluster", **LAUNCHER))
    yield env
    if not already_up:
        subprocess.run(["bash", str(SCRIPT), "stop", state], timeout=300)


def release_requeued_jobs(env: dict, stop: threading.Event, time_min: int) -> None:
    """SLURM holds a requeued job for about 2 minutes (BeginTime); let it start at once, with `time_min` minutes:
    an attempt after a time limit then finishes the run whatever the machine's speed."""
    while not stop.wait(2):
        for line in slurm("squeue", "-h", "-t", "PD", "-o", "%i %r", env=env).splitlines():
            job, reason = line.split(maxsplit=1)
            if reason.strip() == "BeginTime":
                slurm("scontrol", "update", f"JobId={job}", "StartTime=now", f"TimeLimit={time_min}", env=env)


def smoke_definitions(tmp_path: Path, variants=("PPO-GLAM", "SAC-GLAM+HER"), steps: dict | None = None) -> Path:
    definitions = yaml.safe_load((ROOT / "workflow" / "config" / "experiments.yaml").read_text())
    smoke = definitions["experiments"]["smoke"]
    smoke["variants"] = {k: v for k, v in smoke["variants"].items() if k in variants}
    for variant, total in (steps or {}).items():
        smoke["variants"][variant]["total_steps"] = total
    later = dict(smoke, seeds=[5], variants={"PPO-GLAM": smoke["variants"]["PPO-GLAM"]})
    definitions["experiments"]["later"] = later  # an experiment nobody started (mid-campaign)
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump(definitions))
    return path


def config(tmp_path: Path, experiments: Path, names=("smoke",), **launcher) -> list[str]:
    return [
        f"experiments={json.dumps(list(names))}",
        f"experiment_file={experiments}",
        f"results={tmp_path / 'results'}",
        f"models={tmp_path / 'models'}",
        f"hf_cache={tmp_path / 'hf'}",
        f"launcher={json.dumps(LAUNCHER | launcher)}",
    ]


def snakemake(args: list[str], env: dict, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["timeout", str(timeout), SNAKEMAKE, "--cores", "4", "--config", *args],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip


def start_driver(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    out = open(log, "a")  # noqa: SIM115 (closed with the process)
    command = [SNAKEMAKE, "--cores", "4", "--config", *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def accounted(env: dict, *selection: str) -> list[tuple[str, str]]:
    """(job id, state) of every job sacct selects, requeues counted once; none until slurmdbd has them."""
    out = slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", *selection, env=env)
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return sorted({(job, state.split()[0]) for job, state in rows})  # "CANCELLED by 0" -> CANCELLED


def jobs_named(name: str, env: dict) -> list[tuple[str, str]]:
    """(job id, state) of every job with this name in accounting."""
    return accounted(env, f"--name={name}", "-S", "now-1days")


LIVE = ("PENDING", "RUNNING", "COMPLETING", "REQUEUED")


def state(job: str, env: dict) -> str:
    return slurm("squeue", "-h", "-j", job, "-o", "%T", env=env).strip()


def live_job(run, env: dict) -> str | None:
    """The run's recorded job id once SLURM runs it."""
    record = runstate.read_job(run.directory)
    return str(record["job_id"]) if record and state(str(record["job_id"]), env) == "RUNNING" else None


def running_job(runs, env: dict) -> str | None:
    return next(filter(None, (live_job(run, env) for run in runs)), None)


def test_smoke_experiment_through_sbatch_with_requeue(cluster, tmp_path):
    # SLURM signals a job up to 60 s before the time given (`sbatch --signal`): with 2 minutes and signal_delay_s=45,
    # between 15 and 75 s into the job. 8,192 steps of SAC-GLAM+HER take about 2 minutes on an AMD EPYC core
    # (4,096 took 63 s and sometimes finished unsignalled), so the first attempt is always stopped.
    experiments = smoke_definitions(tmp_path, steps={"SAC-GLAM+HER": 8192})
    stop = threading.Event()
    releaser = threading.Thread(target=release_requeued_jobs, args=(cluster, stop, LAUNCHER["time_min"]), daemon=True)
    releaser.start()
    try:
        result = snakemake(config(tmp_path, experiments, time_min=2), cluster)
    finally:
        stop.set()
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "GPU-hour budget of Snakemake's plan: 2 train jobs (2 new)" in result.stderr

    runs = expand(load_definitions(experiments), ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})
    requeued = 0
    for run in runs:
        # Complete outputs.
        done = json.loads((run.directory / "done.json").read_text())
        assert done["env_steps"] == run.config.total_steps and done["world"] == 4
        assert len(set(done["weight_checksums"])) == 1  # the 4 ranks stayed in sync
        rows = (run.directory / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + run.config.total_steps // run.config.eval.every_steps + 1
        # Through sbatch with 4 GPUs, one job per run (requeued in place).
        attempts = [json.loads(line) for line in (run.directory / "attempts.jsonl").read_text().splitlines()]
        job_id = attempts[-1]["job_id"]
        assert [job for job, _ in jobs_named(job_name(run.directory), cluster)] == [job_id]  # one job, requeued
        submission = (run.directory / "slurm" / f"{job_id}_submission.sh").read_text()
        assert "#SBATCH --gres=gpu:4" in submission and "#SBATCH --ntasks-per-node=4" in submission
        assert "gres/gpu=4" in slurm("sacct", "-X", "-n", "-j", job_id, "-o", "AllocTRES%120", env=cluster)
        assert all(a["cuda_visible_devices"] == "0,1,2,3" and a["tasks"] == 4 for a in attempts)
        assert attempts[-1]["exit_status"] == 0
        if len(attempts) > 1:  # killed by the time limit: checkpointed (75), requeued, resumed
            requeued += 1
            assert attempts[0]["exit_status"] == 75
            assert [a["restart_count"] for a in attempts] == list(range(len(attempts)))
            logs = "".join(p.read_text() for p in (run.directory / "slurm").glob("*_0_log.err"))
            assert "resumed at" in logs
    assert requeued >= 1


def test_driver_stopped_and_killed_re_attaches_finished_is_final_and_mid_campaign(cluster, tmp_path):
    experiments = smoke_definitions(tmp_path)
    args = config(tmp_path, experiments)
    runs = expand(load_definitions(experiments), ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})
    log = tmp_path / "driver.txt"

    # 1. SIGTERM while a job runs: the driver detaches at once, the job keeps running.
    driver = start_driver(args, cluster, log)
    job = wait_for(lambda: running_job(runs, cluster), 600, "a running job")
    driver.send_signal(signal.SIGTERM)
    driver.wait(timeout=30)
    assert "driver: SIGTERM: detaching; the SLURM jobs keep running" in log.read_text()
    # The job kept running (a short one may have finished on its own meanwhile: then completed, not cancelled).
    if state(job, cluster) not in ("RUNNING", "COMPLETING"):
        wait_for(lambda: accounted(cluster, "-j", job) == [(job, "COMPLETED")], 60, f"job {job} completed")
    # Mid-campaign, the driver gone: `status` shows the job's run running, read from the run's files and squeue.
    shown = status([*args, 'experiments=["smoke", "later"]'], cluster)
    print(shown)
    row = next(line for line in shown.splitlines() if f" {job} " in line)
    assert " running " in row or state(job, cluster) != "RUNNING", row
    assert "later: 1 runs: 1 not started" in shown

    # 2. Started again: it re-attaches (unless the job ended meanwhile); then kill -9 while a job runs.
    driver = start_driver(args, cluster, log)
    wait_for(
        lambda: f"re-attached to job {job}" in log.read_text() or state(job, cluster) not in LIVE, 120, "re-attach"
    )
    wait_for(lambda: running_job(runs, cluster), 600, "a running job")
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)

    # 3. Started again: it re-attaches (no lock to remove) and the campaign ends.
    driver = start_driver(args, cluster, log)
    assert driver.wait(timeout=1500) == 0, log.read_text()[-4000:]
    assert f"smoke: {len(runs)} runs: {len(runs)} finished;" in status(args, cluster)
    for run in runs:
        jobs = jobs_named(job_name(run.directory), cluster)
        assert len(jobs) == 1 and jobs[0][1] == "COMPLETED", jobs  # exactly one job for the run, whole test long
        attempts = [json.loads(line) for line in (run.directory / "attempts.jsonl").read_text().splitlines()]
        assert [a["exit_status"] for a in attempts] == [0]  # finished once
        rows = (run.directory / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + run.config.total_steps // run.config.eval.every_steps + 1  # complete metrics
        assert runstate.read_job(run.directory)["job_id"] == jobs[0][0]

    # 4. Finished is final: every source file touched, an image newer than everything: nothing to train.
    for path in [*ROOT.glob("sacglam_core/**/*.py"), *ROOT.glob("workflow/**/*"), *ROOT.glob("containers/*")]:
        if path.is_file():
            os.utime(path)
    (ROOT / "pyproject.toml").touch()
    image = tmp_path / "sacglam.sif"
    image.write_text("an image built after everything")
    dry = snakemake([*config(tmp_path, experiments, container=str(image)), "-n"], cluster)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    assert "rule train:" not in out and "total: 0 runs to train, 0.0 GPU-hours planned" in out

    # 5. Mid-campaign: `smoke` finished, `later` never started: figures and the report work.
    both = config(tmp_path, experiments, names=("smoke", "later"))
    figures = snakemake([*both, "--", "figures"], cluster)
    assert figures.returncode == 0, (figures.stdout + figures.stderr)[-3000:]
    assert "later: no finished runs yet (1 planned): skipped" in figures.stdout + figures.stderr
    assert (tmp_path / "results" / "smoke" / "figure2.png").exists()
    report = tmp_path / "report.html"
    made = snakemake([*both, f"--report={report}"], cluster)
    assert made.returncode == 0, (made.stdout + made.stderr)[-3000:]
    assert "figure2.png" in report.read_text()


def status(args: list[str], env: dict) -> str:
    """`python -m sacglam_core.jobs.status` with the workflow's settings (`args`, as Snakemake's --config)."""
    command = [sys.executable, "-m", "sacglam_core.jobs.status", "--profile", env["SNAKEMAKE_PROFILE"],
               "--config", *args]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_copied_profiles_site_options_reach_the_job(cluster, tmp_path):
    """Typed GRES, sbatch options and setup lines from a copied profile's cluster.yaml, as `scontrol show job`
    shows the job."""
    options = {"comment": "sacglam-site", "mail-user": "me@example.org", "mail-type": "END"}
    site = {"gres_type": "fake", "setup": ["echo setup line ran >&2"], "sbatch_options": options}
    profile = copy_cluster_profile(tmp_path, "site", **LAUNCHER, **site)
    env = {**cluster, "SNAKEMAKE_PROFILE": str(profile)}
    experiments = smoke_definitions(tmp_path, variants=("PPO-GLAM",))
    models = {"models": str(tmp_path / "models")}
    (run,) = expand(load_definitions(experiments), ["smoke"], tmp_path / "results", models)
    args = config(tmp_path, experiments)[:-1]  # every setting but the launcher's: the profile's cluster.yaml
    driver = start_driver(args, env, tmp_path / "driver.txt")
    job = wait_for(lambda: live_job(run, env), 600, "the run's job running")
    shown = slurm("scontrol", "show", "job", job, env=env)
    print(shown)
    assert re.search(r"TresPerNode=\S*gres[:/]gpu:fake:4", shown), shown  # the typed GRES (SLURM 22: gres:)
    assert "Comment=sacglam-site" in shown and "MailUser=me@example.org" in shown and "MailType=END" in shown
    assert driver.wait(timeout=900) == 0, (tmp_path / "driver.txt").read_text()[-3000:]
    logs = "".join(path.read_text() for path in (run.directory / "slurm").glob(f"{job}_*_log.*"))
    assert "setup line ran" in logs
    assert re.search(r"/seed0: 1,024/1,024 steps \(100%\), [\d.]+ steps/s, training success", logs)  # progress
    # the GRES types the dry run's mixed-partition check reads with sinfo
    probe = "from sacglam_core.jobs import slurm; print(sorted(slurm.gpu_types('debug')))"
    types = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=ROOT)
    assert types.stdout == "['fake']\n", types.stderr


@pytest.mark.parametrize(
    "launcher, message",
    [
        ({"gres_type": "nosuch"}, "gres_type=nosuch, time_min=10, mem_gb=2; {profile}): allocation failure"),
        ({"sbatch_options": {"mail-type": "SOMETIMES"}}, "mail_type=SOMETIMES; {profile}): sbatch: error: invalid"),
    ],
)
def test_a_bad_site_option_is_refused_by_the_preflight_with_sbatchs_message(cluster, tmp_path, launcher, message):
    experiments = smoke_definitions(tmp_path, variants=("PPO-GLAM",))
    result = snakemake(config(tmp_path, experiments, **launcher), cluster, timeout=300)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: preflight: sbatch --test-only rejected the training jobs' options"), last
    assert message.format(profile=f"{cluster['SNAKEMAKE_PROFILE']}/cluster.yaml").lower() in last.lower(), last
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("job.json"))


def test_sbatch_test_only_refuses_a_bad_partition_before_submitting(cluster, tmp_path):
    experiments = smoke_definitions(tmp_path)
    result = snakemake(config(tmp_path, experiments, partition="nosuch"), cluster, timeout=300)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: preflight: sbatch --test-only rejected the training jobs' options (partition=nosuch")
    assert "invalid partition" in last.lower()
    runs = expand(load_definitions(experiments), ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})
    assert all(jobs_named(job_name(run.directory), cluster) == [] for run in runs)  # nothing was submitted
    assert not any(runstate.read_job(run.directory) for run in runs)


def test_a_users_scancel_is_not_undone(cluster, tmp_path):
    # A run far longer than the test (it is cancelled): it cannot finish before the scancel, whatever the machine.
    experiments = smoke_definitions(tmp_path, variants=("PPO-GLAM",), steps={"PPO-GLAM": 65536})
    (run,) = expand(
        load_definitions(experiments), ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")}
    )
    log = tmp_path / "driver.txt"
    driver = start_driver(config(tmp_path, experiments), cluster, log)
    job = wait_for(lambda: live_job(run, cluster), 600, "the running job")
    wait_for(lambda: (run.directory / "metrics.csv").exists(), 300, "training to start")
    slurm("scancel", job, env=cluster)
    assert driver.wait(timeout=300) != 0
    text = log.read_text()
    assert f"SLURM job {job} was cancelled; not submitted again by this invocation" in text
    assert f"its job {job} was cancelled during this invocation" in text  # Snakemake's retries do not resubmit
    time.sleep(5)
    assert jobs_named(job_name(run.directory), cluster) == [(job, "CANCELLED")]  # not requeued, not resubmitted
    records = slurm("sacct", "-X", "--duplicates", "-n", "-P", "-j", job, "-o", "JobID,State", env=cluster).splitlines()
    assert len(records) == 1 and not (run.directory / "done.json").exists()  # one record: never requeued
