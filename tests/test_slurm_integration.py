"""The workflow on a real single-node SLURM cluster (workflow/scripts/slurm_cluster.sh): every run is an
sbatch job through submitit with 4 (fake) GPUs and 4 ranks, one is killed by its time limit, requeued
and finishes from its checkpoint. Run deliberately: `pytest -m slurm` (CI does)."""

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from sacglam_core.pipeline.experiments import expand, load_definitions

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workflow" / "scripts" / "slurm_cluster.sh"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def slurm(*command: str, env: dict) -> str:
    return subprocess.run(["timeout", "30", *command], capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def cluster():
    """The test cluster's client environment; stopped afterwards only if this fixture started it."""
    state = os.environ.get("SLURM_TEST_DIR", "/tmp/sacglam-slurm")
    already_up = subprocess.run(["bash", str(SCRIPT), "status", state], capture_output=True).returncode == 0
    if not already_up:
        subprocess.run(["bash", str(SCRIPT), "start", state], check=True, timeout=900)
    exports = subprocess.run(["bash", str(SCRIPT), "env", state], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    env.update(re.findall(r"export (\w+)=(\S+)", exports))
    yield env
    if not already_up:
        subprocess.run(["bash", str(SCRIPT), "stop", state], timeout=300)


def release_requeued_jobs(env: dict, stop: threading.Event) -> None:
    """SLURM holds a requeued job for about 2 minutes (BeginTime); let it start at once."""
    while not stop.wait(2):
        for line in slurm("squeue", "-h", "-t", "PD", "-o", "%i %r", env=env).splitlines():
            job, reason = line.split(maxsplit=1)
            if reason.strip() == "BeginTime":
                slurm("scontrol", "update", f"JobId={job}", "StartTime=now", env=env)


def test_smoke_experiment_through_sbatch_with_requeue(cluster, tmp_path):
    definitions = yaml.safe_load((ROOT / "workflow" / "config" / "experiments.yaml").read_text())
    smoke = definitions["experiments"]["smoke"]
    smoke["variants"] = {k: v for k, v in smoke["variants"].items() if k in ("PPO-GLAM", "SAC-GLAM+HER")}
    smoke["variants"]["SAC-GLAM+HER"]["total_steps"] = 4096  # outlives the 2-minute time limit
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(yaml.safe_dump(definitions))
    launcher = {
        "container": None,  # the test override: no Apptainer on this machine
        "partition": "debug",
        "constraint": None,
        "qos": None,
        "gpus_per_node": 4,
        "cpus_per_gpu": 1,
        "mem_gb": 2,
        "time_min": 2,
        "signal_delay_s": 45,
        "threads_per_task": 1,
    }
    config = [
        "experiments=[smoke]",
        f"experiment_file={experiments}",
        f"results={tmp_path / 'results'}",
        f"models={tmp_path / 'models'}",
        f"hf_cache={tmp_path / 'hf'}",
        f"launcher={json.dumps(launcher)}",
    ]
    stop = threading.Event()
    releaser = threading.Thread(target=release_requeued_jobs, args=(cluster, stop), daemon=True)
    releaser.start()
    try:
        command = [SNAKEMAKE, "--nolock", "--profile", "profiles/slurm", "--cores", "2", "--config", *config]
        result = subprocess.run(["timeout", "1500", *command], cwd=ROOT, env=cluster, capture_output=True, text=True)
    finally:
        stop.set()
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "GPU-hour budget" in result.stderr

    runs = expand(load_definitions(experiments), ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})
    assert len(runs) == 2
    requeued = 0
    for run in runs:
        # Complete outputs.
        done = json.loads((run.directory / "done.json").read_text())
        assert done["env_steps"] == run.config.total_steps and done["world"] == 4
        assert len(set(done["weight_checksums"])) == 1  # the 4 ranks stayed in sync
        rows = (run.directory / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + run.config.total_steps // run.config.eval.every_steps + 1
        # Through sbatch with 4 GPUs.
        attempts = [json.loads(line) for line in (run.directory / "attempts.jsonl").read_text().splitlines()]
        job_id = attempts[-1]["job_id"]
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
