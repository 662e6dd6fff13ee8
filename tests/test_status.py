"""The `status` command: each run's state from the files the runs and the driver write, the totals per experiment,
and nothing changed by looking."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sacglam_core.pipeline import runstate
from sacglam_core.pipeline.experiments import expand, load_definitions
from sacglam_core.pipeline.status import report, status_of

ROOT = Path(__file__).resolve().parents[1]
DEFINITIONS = ROOT / "workflow" / "config" / "experiments.yaml"


def write(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))


def checkpoint(run_dir: Path, steps: int) -> None:
    write(run_dir / "checkpoints" / f"ckpt-{steps:09d}.json", {"number": steps, "world": 1, "files": {}})


@pytest.fixture
def campaign(tmp_path):
    """The demo's 15 runs: one finished, running, queued, failed and stopped each, the rest not started."""
    runs = expand(load_definitions(DEFINITIONS), ["mini"], tmp_path / "results", {"models": "resources/models"})
    finished, running, queued, failed, stopped = (run.directory for run in runs[:5])
    write(finished / runstate.DONE, {"wall_seconds": 7200, "gpus": 4, "eval_success": 0.625, "env_steps": 6400})
    write(finished / runstate.JOB_RECORD, {"job_id": "11"})
    now = time.time()
    write(running / runstate.PROGRESS, {"env_steps": 3200, "steps_per_s": 3.5, "eta_s": 900, "wall_seconds": 1800,
                                        "gpus": 4, "time": now})  # fmt: skip
    write(running / "lease", {"pid": os.getpid(), "host": socket.gethostname()})  # this process: alive
    write(queued / runstate.JOB_RECORD, {"job_id": "14"})
    checkpoint(failed, 1280)
    write(failed / runstate.JOB_RECORD, {"job_id": "13", "ended": "TIMEOUT"})
    write(failed / "slurm" / "13_0_log.err", "loading\nRuntimeError: CUDA error: out of memory\nsrun: error: task 0\n")
    checkpoint(stopped, 640)
    return runs


def test_each_state_and_the_totals(campaign):
    queue = {"14": ("PENDING", "sacglam-x")}
    states = [status_of(run, queue if i != 1 else None) for i, run in enumerate(campaign)]
    assert [s.state for s in states[:6]] == ["finished", "running", "queued", "failed", "stopped", "not started"]
    finished, running, queued, failed, stopped = states[:5]
    assert finished.gpu_hours == 8.0 and finished.job == "11" and "0.625" in finished.note
    assert (running.steps, running.steps_per_s, running.gpu_hours) == (3200, 3.5, 2.0) and "ETA 15 min" in running.note
    assert queued.job == "14" and queued.note == "PENDING"
    assert failed.steps == 1280 and failed.note == "TIMEOUT: RuntimeError: CUDA error: out of memory"
    assert stopped.steps == 640 and "resumes" in stopped.note
    text = report(states, "results")
    assert text.splitlines()[-1] == (
        "  mini: 15 runs: 1 finished, 1 running, 1 queued, 1 stopped, 1 failed, 10 not started; 10.0 GPU-h spent"
    )
    assert "3,200/6,400 (50%)" in text


def test_the_command_reads_a_profile_and_changes_nothing(campaign, tmp_path):
    results = tmp_path / "results"
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in results.rglob("*") if p.is_file()}
    command = [sys.executable, "-m", "sacglam_core.pipeline.status", "--profile", "profiles/local", "mini",
               "--results", str(results)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"15 runs under {results}")
    assert " running " in result.stdout and "1 finished, 1 running" in result.stdout
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in results.rglob("*") if p.is_file()}
    assert after == before


def test_an_unknown_experiment_is_one_line(tmp_path):
    command = [sys.executable, "-m", "sacglam_core.pipeline.status", "--profile", "profiles/local", "nope"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and "nope" in result.stderr
