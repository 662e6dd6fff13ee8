"""The training loop end to end on the tiny models: runs, metrics, resume equality, bad input, 2 ranks."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from sacglam_core.metrics import COLUMNS, TIMING_COLUMNS

TRAIN = [sys.executable, "-m", "sacglam_core.train"]


def write_config(path: Path, model: Path, **settings) -> Path:
    config = {
        "model": {"name_or_path": str(model)},
        "output_dir": str(path.parent / "out"),
        "total_steps": 384,
        "num_envs": 8,
        "threads": 1,
        "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
        "eval": {"every_steps": 128, "episodes_per_type": 4, "test_episodes": 4},
        "checkpoint": {"every_updates": 4},
    }
    for key, value in settings.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


SAC_HER = {
    "algorithm": "sac",
    "sac": {"batch_size": 16, "update_every": 16, "critic": {"input": "decoded_action", "hidden_units": 32}},
    "her": {"enabled": True},
}
PPO_CLIP_HER = {
    "algorithm": "ppo",
    "ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32, "center_clip": True},
    "her": {"enabled": True, "aligned_only": True},
}
PPO_KL = {"algorithm": "ppo", "ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32, "loss": "kl"}}


def train(config: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*TRAIN, "--config", str(config), *extra], capture_output=True, text=True, timeout=600)
    if check and result.returncode not in (0, 75):
        raise AssertionError(result.stderr[-3000:])
    return result


def rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def without_timing(table: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in table]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_models):
    """Uninterrupted runs, one per algorithm setting."""
    runs = {}
    for name, settings in {"sac_her": SAC_HER, "ppo_clip_her": PPO_CLIP_HER}.items():
        config = write_config(tmp_path_factory.mktemp(name) / "run.yaml", tiny_models["tiny-t5"], **settings)
        assert train(config).returncode == 0
        runs[name] = config.parent / "out"
    return runs


def test_run_writes_metrics_config_and_done_marker(reference):
    out = reference["sac_her"]
    table = rows(out)
    assert list(table[0]) == COLUMNS
    assert [int(r["env_steps"]) for r in table] == [0, 128, 256, 384]
    last = table[-1]
    for column in (
        "eval_success",
        "eval_success_grasp",
        "eval_success_test",
        "critic_loss",
        "alpha",
        "entropy",
        "mean_q",
        "her_share",
    ):
        assert last[column] not in ("", "nan"), column
    assert 0 < float(last["her_share"]) < 1
    assert float(last["updates_per_s"]) > 0 and float(last["wall_seconds"]) > 0
    # training time (acting and updates) leaves out the evaluations and checkpoints that wall time includes
    train_seconds = [float(r["train_seconds"]) for r in table]
    assert train_seconds[0] == 0 and train_seconds == sorted(train_seconds) and train_seconds[-1] > 0
    assert all(float(r["train_seconds"]) < float(r["wall_seconds"]) for r in table[1:])
    done = json.loads((out / "done.json").read_text())
    assert done["env_steps"] == 384
    assert done["dtype"] == "float32" and done["lora_target_modules"] is None  # as run: auto is float32 on CPU
    assert done["train_seconds"] == train_seconds[-1] < done["wall_seconds"]
    assert yaml.safe_load((out / "config.yaml").read_text())["her"]["enabled"] is True
    ppo = rows(reference["ppo_clip_her"])[-1]
    assert all(ppo[c] not in ("", "nan") for c in ("policy_loss", "value_loss", "entropy", "clipfrac", "her_share"))


def test_finished_run_is_not_run_again(reference):
    before = (reference["sac_her"] / "metrics.csv").read_text()
    result = train(reference["sac_her"].parent / "run.yaml")
    assert result.returncode == 0 and "already finished" in result.stderr
    assert (reference["sac_her"] / "metrics.csv").read_text() == before


@pytest.mark.parametrize("name, settings", [("sac_her", SAC_HER), ("ppo_clip_her", PPO_CLIP_HER)])
def test_resume_equals_uninterrupted_run(tmp_path, tiny_models, reference, name, settings):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    first = train(config, "--stop-at-steps", "200")
    assert first.returncode == 75 and "checkpointed at 200 steps" in first.stderr
    assert not (tmp_path / "out" / "done.json").exists()
    second = train(config)
    assert second.returncode == 0 and "resumed at 200" in second.stderr
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference[name]))


def test_sigterm_checkpoints_and_resume_matches(tmp_path, tiny_models, reference):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    process = subprocess.Popen([*TRAIN, "--config", str(config)], stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "metrics.csv"
    deadline = time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 75, stderr[-2000:]
    assert train(config).returncode == 0
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference["sac_her"]))


def test_killed_run_resumes_from_periodic_checkpoint(tmp_path, tiny_models, reference):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    process = subprocess.Popen([*TRAIN, "--config", str(config)], stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "out" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(checkpoints.glob("ckpt-*.json"))) < 2:
        time.sleep(0.1)
    process.kill()  # no chance to checkpoint: metrics rows after the last checkpoint must be dropped
    process.wait()
    assert train(config).returncode == 0
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference["sac_her"]))


def test_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path, tiny_models, reference):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    assert train(config, "--stop-at-steps", "200").returncode == 75
    checkpoints = tmp_path / "out" / "checkpoints"
    newest = sorted(checkpoints.glob("ckpt-*.shared.pt"))[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a partial write
    (checkpoints / ".ckpt-000000999.shared.pt.tmp-1").write_bytes(b"junk")  # a crashed write in progress
    result = train(config)
    assert result.returncode == 0
    assert f"skipping checkpoint {newest.name.replace('.shared.pt', '.json')}" in result.stderr
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference["sac_her"]))


def test_checkpoints_of_another_configuration_are_refused(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    assert train(config, "--stop-at-steps", "64").returncode == 75
    write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **{**SAC_HER, "seed": 1})
    result = train(config, check=False)
    assert result.returncode == 2 and "belong to another configuration" in result.stderr


def test_ppo_kl_runs(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-causal"], total_steps=128, **PPO_KL)
    assert train(config).returncode == 0
    assert rows(tmp_path / "out")[-1]["kl"] not in ("", "nan")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"algorithm": "sac", "sac": {"batchsize": 8}}, "sac.batchsize: Unexpected keyword argument"),
        ({"algorithm": "sac", "sac": {"batch_size": "many"}}, "sac.batch_size: Input should be a valid integer"),
        ({"algorithm": "ppo", "her": {"ratio": 0.5}}, "her.strategy and her.ratio shape SAC's replay batches"),
        ({"algorithm": "sac", "her": {"strategy": "prior"}}, "her.enabled is false"),
        ({"algorithm": "ppo", "ppo": {"center_clip": True}}, "center_clip needs her.enabled"),
        ({"algorithm": "dqn"}, "algorithm: Input should be 'sac' or 'ppo'"),
    ],
)
def test_bad_configuration_fails_at_start_with_one_message(tmp_path, tiny_models, settings, message):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    result = train(config, check=False)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1  # one line
    assert not (tmp_path / "out").exists()


def test_missing_model_says_how_to_stage_it(tmp_path):
    config = write_config(tmp_path / "run.yaml", tmp_path / "no-such-model", algorithm="sac")
    result = train(config, check=False)
    assert result.returncode == 2 and "python -m sacglam_core.models build-tiny" in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SAC_HER_SMALL_BUFFER = {**SAC_HER, "sac": {**SAC_HER["sac"], "buffer_size": 65}}


@pytest.mark.parametrize("settings", [SAC_HER_SMALL_BUFFER, PPO_CLIP_HER], ids=["sac", "ppo"])
def test_two_ranks_on_gloo_stay_in_sync(tmp_path, tiny_models, settings):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=128, **settings)
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*launcher, "-m", "sacglam_core.train", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    done = json.loads((tmp_path / "out" / "done.json").read_text())
    assert done["world"] == 2 and len(set(done["weight_checksums"])) == 1
    assert int(rows(tmp_path / "out")[-1]["updates"]) > 0
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").glob("*.rank*.pt"))[-2:] == [
        "ckpt-000000128.rank0.pt",
        "ckpt-000000128.rank1.pt",
    ]
    if settings["algorithm"] == "sac":  # sac.buffer_size is the run's capacity: the ranks share it, 33 + 32
        buffers = [
            torch.load(tmp_path / "out" / "checkpoints" / f"ckpt-000000128.rank{r}.pt", weights_only=True)["algo"]
            for r in (0, 1)
        ]
        assert [b["buffer"]["size"] for b in buffers] == [33, 32]  # full: each rank added far more than its share
