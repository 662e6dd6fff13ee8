"""The `status` command: each run's state from the files the runs and the driver write, the totals per experiment,
and nothing changed by looking; a damaged file is one run's note, with what the next launch does about it."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_workflow import local_config, snakemake

from sacglam_core import runfiles
from sacglam_core.config import dump_config
from sacglam_core.jobs import runstate
from sacglam_core.jobs.status import report, status_of
from sacglam_core.lease import RunLease
from sacglam_core.pipeline.experiments import expand, load_definitions

ROOT = Path(__file__).resolve().parents[1]
DEFINITIONS = ROOT / "workflow" / "config" / "experiments.yaml"
STATUS = [sys.executable, "-m", "sacglam_core.jobs.status", "--profile", "profiles/local"]


def write(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))


def checkpoint(run_dir: Path, steps: int) -> None:
    write(run_dir / "checkpoints" / f"ckpt-{steps:09d}.json", {"number": steps, "world": 1, "files": {}})


@pytest.fixture
def campaign(tmp_path):
    """The demo's 15 runs: one finished, running (its trainer holds the lease), queued, failed and stopped each, one
    stopped with the lease record of a live process that does not hold it, the rest not started."""
    runs = expand(load_definitions(DEFINITIONS), ["mini"], tmp_path / "results", {"models": "resources/models"})
    finished, running, queued, failed, stopped, stale = (run.directory for run in runs[:6])
    write(finished / runfiles.DONE, {"wall_seconds": 7200, "gpus": 4, "eval_success": 0.625, "env_steps": 6400})
    write(finished / runstate.JOB_RECORD, {"job_id": "11"})
    write(running / runfiles.PROGRESS, {"env_steps": 3200, "steps_per_s": 3.5, "eta_s": 18, "wall_seconds": 1800,
                                        "gpus": 4, "time": time.time()})  # fmt: skip
    write(queued / runstate.JOB_RECORD, {"job_id": "14"})
    checkpoint(failed, 1280)
    write(failed / runstate.JOB_RECORD, {"job_id": "13", "ended": "TIMEOUT"})
    write(failed / "slurm" / "13_0_log.err", "loading\nRuntimeError: CUDA error: out of memory\nsrun: error: task 0\n")
    checkpoint(stopped, 640)
    checkpoint(stale, 320)
    write(stale / "lease", {"pid": os.getpid(), "host": socket.gethostname()})  # a live pid, but no flock
    with RunLease(running):
        yield runs


def test_each_state_and_the_totals(campaign):
    queue = {"14": ("PENDING", "sacglam-x")}
    states = [status_of(run, queue if i != 1 else None) for i, run in enumerate(campaign)]
    assert [s.state for s in states[:7]] == [
        "finished", "running", "queued", "failed", "stopped", "stopped", "not started"
    ]  # fmt: skip
    assert [s.next_launch for s in states[:7]] == [
        "finished", "new", "in queue", "resumes", "resumes", "resumes", "new"
    ]  # fmt: skip
    finished, running, queued, failed, stopped, stale = states[:6]
    assert finished.gpu_hours == 8.0 and finished.job == "11" and "0.625" in finished.note
    assert (running.steps, running.steps_per_s, running.gpu_hours) == (3200, 3.5, 2.0)
    assert running.job == f"pid {os.getpid()}" and running.note.startswith("ETA 18 s, last progress ")  # the trainer's
    assert queued.job == "14" and queued.note == "PENDING"
    assert failed.steps == 1280 and failed.note == "TIMEOUT: RuntimeError: CUDA error: out of memory"
    assert stopped.steps == 640 and stopped.note == "the next launch resumes it from its last checkpoint"
    assert stale.steps == 320 and stale.job == ""
    text = report(states, "results")
    assert text.splitlines()[-1] == (
        "  mini: 15 runs: 1 finished, 1 running, 1 queued, 2 stopped, 1 failed, 9 not started; 10.0 GPU-h spent"
    )
    assert "3,200/6,400 (50%)" in text


def test_the_command_reads_a_profile_and_changes_nothing(campaign, tmp_path):
    results = tmp_path / "results"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in results.rglob("*") if p.is_file()}
    result = subprocess.run([*STATUS, "mini", "--results", str(results)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"15 runs under {results}")
    assert " running " in result.stdout and "1 finished, 1 running" in result.stdout
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in results.rglob("*") if p.is_file()}
    assert after == before


def test_an_unknown_experiment_is_one_line(tmp_path):
    result = subprocess.run([*STATUS, "nope"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "nope" in result.stderr


def test_experiments_after_config_are_experiments(tmp_path):
    """`--config` takes every word after it, as Snakemake's: one without "=" is an experiment."""
    (tmp_path / "results").mkdir()
    command = [*STATUS, "--config", f"results={tmp_path / 'results'}", "smoke"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "  smoke: 3 runs: 3 not started; 0.0 GPU-h spent"


def test_a_missing_results_folder_is_one_line_naming_where_it_was_set(tmp_path):
    absent = tmp_path / "absent"
    result = subprocess.run([*STATUS, "--config", f"results={absent}"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: results folder {absent} (set by --config) does not exist: no run started there\n"
    profile = tmp_path / "profile"
    write(profile / "config.yaml", "configfile: workflow.yaml\n")
    write(profile / "workflow.yaml", f"experiments: [smoke]\nlauncher: {{executor: local}}\nresults: {absent}\n")
    command = [sys.executable, "-m", "sacglam_core.jobs.status", "--profile", str(profile)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: results folder {absent} (set by {profile}/workflow.yaml) does not exist")


TRUNCATED = '{"env_steps": 64'


def finished_by_hand(run, summary: dict | str, marker: bool) -> None:
    """done.json (`summary`), config.yaml and, with `marker`, train.done: a finished run's files."""
    write(run.directory / "config.yaml", dump_config(run.config))
    write(run.directory / runfiles.DONE, summary)
    if marker:
        write(run.directory / runfiles.MARKER, "{}")


def damaged_campaign(tmp_path: Path, damage: dict) -> list:
    """The demo's runs under tmp_path, `damage` (seed index -> a function of the run) done to them, the models
    there (else Snakemake would plan to build them and every run after them)."""
    for model in ("tiny-t5", "tiny-causal", "tiny-causal-pretrained"):
        (tmp_path / "models" / model).mkdir(parents=True)
    runs = expand(load_definitions(DEFINITIONS), ["mini"], tmp_path / "results", {"models": str(tmp_path / "models")})
    for index, how in damage.items():
        how(runs[index])
    return runs


def planned(result: subprocess.CompletedProcess) -> tuple[set[Path], Counter]:
    """Snakemake's plan in a dry run's output: the directories of the runs it trains and, per variant, the budget's
    status of those runs (new, resumes, in queue, finished)."""
    markers = re.findall(rf"^\s+output: (\S+)/{runfiles.MARKER}$", result.stdout, re.M)
    table = result.stderr.split("GPU-hour budget of Snakemake's plan", 1)[1].split("  paper:", 1)[0]
    rows = re.findall(r"^ {4}(\S+) +(\d+)  (new|resumes|in queue|finished) ", table, re.M)
    return {Path(m) for m in markers}, Counter({(variant, status): int(n) for variant, n, status in rows})


def test_damaged_files_are_named_with_what_the_next_launch_does(tmp_path):
    """Each damaged file is its run's note (the file, the key and the value) and never stops the command or the
    launch; what status says the next launch does is what Snakemake's dry run plans."""
    damage = {
        0: lambda run: finished_by_hand(run, {"wall_seconds": "x", "env_steps": 6400}, marker=False),
        1: lambda run: finished_by_hand(run, {"eval_success": None, "env_steps": 6400}, marker=True),
        2: lambda run: finished_by_hand(run, {"gpus": "four", "wall_seconds": 60}, marker=False),
        3: lambda run: finished_by_hand(run, TRUNCATED, marker=True),
        4: lambda run: write(run.directory / runfiles.MARKER, "{}"),
        5: lambda run: (write(run.directory / runfiles.PROGRESS, {"env_steps": "abc"}), checkpoint(run.directory, 640)),
        6: lambda run: write(run.directory / runfiles.PROGRESS, {"env_steps": None}),
        7: lambda run: write(run.directory / runfiles.PROGRESS, '{"env_steps": 3'),
        8: lambda run: (write(run.directory / runstate.JOB_RECORD, {"job_id": 13}), checkpoint(run.directory, 320)),
        9: lambda run: (checkpoint(run.directory, 320),
                        write(run.directory / "checkpoints" / "ckpt-000000960.json", {"number": -5, "world": 1})),
        10: lambda run: write(run.directory / "checkpoints" / "ckpt-000000640.json", '{"number": 640, "world": NaN}'),
        11: lambda run: finished_by_hand(run, '{"wall_seconds": NaN, "gpus": 0}', marker=False),
        12: lambda run: finished_by_hand(run, [6400], marker=True),
        13: lambda run: (checkpoint(run.directory, 128), write(run.directory / "lease", "[")),  # not held: unread
        14: lambda run: checkpoint(run.directory, 128),  # and its trainer holds it, with a damaged record
    }  # fmt: skip
    runs = damaged_campaign(tmp_path, damage)
    config = local_config(tmp_path, ["mini"])
    with RunLease(runs[14].directory):
        write(runs[14].directory / "lease", '{"pid": "abc"}')
        states = {run.directory: status_of(run, None) for run in runs}
        command = subprocess.run([*STATUS, "--config", *config], cwd=ROOT, capture_output=True, text=True, timeout=120)
        dry = snakemake("--profile", "profiles/local", "-n", "--config", *config)
    expected = [  # state, next launch, the file named, what is wrong with it
        ("damaged", "finished", runfiles.DONE, 'wall_seconds: "x" is not a non-negative number'),
        ("damaged", "finished", runfiles.DONE, "eval_success: null is not a non-negative number"),
        ("damaged", "finished", runfiles.DONE, 'gpus: "four" is not a non-negative integer'),
        ("damaged", "finished", runfiles.DONE, "exists but cannot be read (Expecting ',' delimiter"),
        ("damaged", "finished", runfiles.MARKER, f"exists without {runfiles.DONE}"),
        ("damaged", "resumes", runfiles.PROGRESS, 'env_steps: "abc" is not a non-negative integer'),
        ("damaged", "new", runfiles.PROGRESS, "env_steps: null is not a non-negative integer"),
        ("damaged", "new", runfiles.PROGRESS, "exists but cannot be read (Expecting ',' delimiter"),
        ("damaged", "resumes", runstate.JOB_RECORD, "job_id: 13 is not a non-empty string"),
        ("damaged", "resumes", "checkpoints/ckpt-000000960.json", "number: -5 is not a non-negative integer"),
        ("damaged", "new", "checkpoints/ckpt-000000640.json", "world: NaN is not a non-negative integer"),
        ("damaged", "finished", runfiles.DONE, "wall_seconds: NaN is not a non-negative number"),
        ("damaged", "finished", runfiles.DONE, "does not hold a run summary"),
        ("stopped", "resumes", None, "the next launch resumes it"),
        ("running", "resumes", "lease", 'pid: "abc" is not a non-negative integer'),
    ]
    for run, (state, upcoming, file, problem) in zip(runs, expected, strict=True):
        shown = states[run.directory]
        assert (shown.state, shown.next_launch) == (state, upcoming), (run.directory, shown)
        assert problem in shown.note and (file is None or f"{run.directory / file}" in shown.note), shown.note
    assert states[runs[0].directory].note.endswith("; the next launch trains nothing")
    assert states[runs[5].directory].steps == 640 and states[runs[9].directory].steps == 320
    assert command.returncode == 0 and command.stderr == "", command.stderr
    assert command.stdout.splitlines()[-1].startswith("  mini: 15 runs: 1 running, 1 stopped, 13 damaged; ")

    assert dry.returncode == 0 and "Traceback" not in dry.stderr and "not available" not in dry.stderr, dry.stderr
    trained, budget = planned(dry)
    assert trained == {run.directory for run in runs if not (run.directory / runfiles.MARKER).exists()}
    plan = Counter((run.variant, states[run.directory].next_launch) for run in runs if run.directory in trained)
    assert budget == plan
    assert all(states[run.directory].next_launch == "finished" for run in runs if run.directory not in trained)


def test_a_done_json_that_cannot_be_read_without_its_marker_makes_the_launch_refuse(tmp_path):
    runs = damaged_campaign(tmp_path, {5: lambda run: finished_by_hand(run, TRUNCATED, marker=False)})
    shown = status_of(runs[5], None)
    assert (shown.state, shown.next_launch) == ("damaged", "refuses")
    assert shown.note.endswith("; the next launch refuses to start, for every run, until this is repaired")
    launch = snakemake("--profile", "profiles/local", "--config", *local_config(tmp_path, ["mini"]), timeout=300)
    assert launch.returncode == 2 and "Traceback" not in launch.stderr, launch.stderr[-3000:]
    refusal = launch.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"error: {runs[5].directory / runfiles.DONE} exists but cannot be read"), refusal
    assert refusal.removeprefix("error: ") in shown.note
    assert not any((run.directory / "run.yaml").exists() for run in runs)  # nothing was started


def test_without_a_profile_it_reads_the_last_launchs_settings_or_names_the_profiles(tmp_path):
    """After `cp -r profiles/slurm profiles/mine` and a launch with it, `status` alone reads what the launch read
    (`<results>/.driver/launch.json`, which the driver writes); with no launch recorded it takes the one profile with a
    cluster file, and names the profiles when there are several; a damaged record is one line naming it."""
    from sacglam_core.jobs.driver import LAUNCH_FILE

    results = tmp_path / "results"
    profile = tmp_path / "profiles" / "mine"
    write(profile / "config.yaml", "configfile: workflow.yaml\n")
    write(profile / "workflow.yaml", f"experiments: [smoke]\nlauncher: {{executor: local}}\nresults: {results}\n")
    record = {"configfiles": [str(ROOT / "workflow/config/config.yaml"), str(profile / "workflow.yaml")], "config": {}}
    write(results / ".driver" / LAUNCH_FILE, json.dumps(record))
    command = [sys.executable, "-m", "sacglam_core.jobs.status", "--results", str(results)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "  smoke: 3 runs: 3 not started; 0.0 GPU-h spent"

    elsewhere = tmp_path / "elsewhere"  # no launch recorded: the profiles decide
    for name in ("one", "two"):
        write(elsewhere / "profiles" / name / "config.yaml", "configfile: workflow.yaml\n")
        write(elsewhere / "profiles" / name / "workflow.yaml", f"results: {results}\nexperiments: [smoke]\n")
        write(elsewhere / "profiles" / name / "cluster.yaml", "launcher: {executor: local}\n")
    result = subprocess.run(command[:-2], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "2 profiles with a cluster file: name the campaign's with --profile" in result.stderr
    assert "profiles/one, profiles/two" in result.stderr

    write(results / ".driver" / LAUNCH_FILE, '{"configfiles": ')
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {results / '.driver' / LAUNCH_FILE}: not a")


def test_run_names_are_shown_whole_so_that_no_two_runs_share_a_row(tmp_path):
    """The critic ablation's grid names its variants `input=obs_action weights=shared` and the like: cut to a width,
    two variants and their seeds read alike; whole, every row names one run, with the device plan of a finished one."""
    runs = expand(load_definitions(DEFINITIONS), ["critic_architecture"], tmp_path / "results")
    summary = {"wall_seconds": 60, "gpus": 1, "eval_success": 0.5, "env_steps": runs[0].config.total_steps,
               "device_plan": {"summary": "cuda:0 (NVIDIA H200, sm_90), bfloat16, static shapes, captured, compiled; "
                                          "one process"}}  # fmt: skip
    write(runs[0].directory / runfiles.DONE, summary)
    text = report([status_of(run, None) for run in runs], str(tmp_path / "results"))
    rows = text.splitlines()[2 : 2 + len(runs)]
    names = [f"{r.experiment}/{r.directory.parent.name}/{r.directory.name}" for r in runs]
    assert max(map(len, names)) > 51  # what the table used to cut them to
    assert [row.split()[0] for row in rows] == names and len(set(names)) == len(runs)
    assert rows[0].endswith("final success 0.500; plan: cuda:0 (NVIDIA H200, sm_90), bfloat16, static shapes, "
                            "captured, compiled; one process")  # fmt: skip
