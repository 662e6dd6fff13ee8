"""The training loop end to end on the tiny models: runs, metrics, resume equality, bad input, 2 ranks."""

import csv
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_runs import write_config

from sacglam_core import runfiles
from sacglam_core.metrics import COLUMNS, TIMING_COLUMNS

TRAIN = [sys.executable, "-m", "sacglam_core.train"]


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
SAC_HER_LP = {**SAC_HER, "goals": {"sampler": "learning_progress", "window": 10}}
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
    for name, settings in {"sac_her": SAC_HER, "ppo_clip_her": PPO_CLIP_HER, "sac_her_lp": SAC_HER_LP}.items():
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
    assert done["gpus"] == 0 and done["cpu_name"]  # which CPU type made these numbers, and with which kernels
    assert done["cpu_kernels"] == ("AVX2" if platform.machine() == "x86_64" else done["cpu_kernels"])
    model = Path(yaml.safe_load((out / "config.yaml").read_text())["model"]["name_or_path"])
    assert done["model_sha256"] == hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert done["train_seconds"] == train_seconds[-1] < done["wall_seconds"]
    assert yaml.safe_load((out / "config.yaml").read_text())["her"]["enabled"] is True
    ppo = rows(reference["ppo_clip_her"])[-1]
    assert all(ppo[c] not in ("", "nan") for c in ("policy_loss", "value_loss", "entropy", "clipfrac", "her_share"))


def test_a_goal_sampler_chooses_goals_among_those_described_and_shows_its_buckets(reference):
    table = rows(reference["sac_her_lp"])
    known = [float(r["goals_known"]) for r in table]
    assert known == sorted(known) and known[-1] > 0
    buckets = json.loads(table[-1]["goal_buckets"])
    assert buckets and all(key.split("/")[0] in ("share", "lp") for key in buckets)
    assert sum(v for k, v in buckets.items() if k.startswith("share/")) == pytest.approx(1.0)
    assert all(r["goals_known"] == "" for r in rows(reference["sac_her"]))  # uniform: the paper's draw, no sampler


def test_finished_run_is_not_run_again(reference):
    before = (reference["sac_her"] / "metrics.csv").read_text()
    result = train(reference["sac_her"].parent / "run.yaml")
    assert result.returncode == 0 and "already finished" in result.stderr
    assert (reference["sac_her"] / "metrics.csv").read_text() == before


@pytest.mark.parametrize(
    "name, settings", [("sac_her", SAC_HER), ("ppo_clip_her", PPO_CLIP_HER), ("sac_her_lp", SAC_HER_LP)]
)
def test_resume_equals_uninterrupted_run(tmp_path, tiny_models, reference, name, settings):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    first = train(config, "--stop-at-steps", "200")
    assert first.returncode == 75 and "checkpointed at 200 steps" in first.stderr
    assert not (tmp_path / "out" / "done.json").exists()
    second = train(config)
    assert second.returncode == 0 and "resumed at 200" in second.stderr
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference[name]))


def test_the_requeue_drill_stops_the_first_attempt_only_and_done_json_says_what_ran(tmp_path, tiny_models):
    config = write_config(
        tmp_path / "run.yaml",
        tiny_models["tiny-t5"],
        **SAC_HER,
        model={"lora": {"r": 4, "alpha": 8}},
        checkpoint={"every_updates": 4, "drill_at_steps": 200},
    )
    first = train(config)
    assert first.returncode == 75 and "requeue drill" in first.stderr and "checkpointed at 200 steps" in first.stderr
    second = train(config)
    assert second.returncode == 0 and "resumed at 200" in second.stderr and "requeue drill" not in second.stderr
    done = json.loads((tmp_path / "out" / "done.json").read_text())
    assert done["env_steps"] == 384 and done["lora_b_norm"] > 0  # LoRA's B matrices start at zero
    assert done["container"] is None and done["model_commit"] is None and isinstance(done["hub_offline"], bool)


@pytest.mark.parametrize("settings", [SAC_HER_LP, PPO_CLIP_HER], ids=["sac_lp", "ppo"])
def test_ranks_held_by_one_process_resume_as_an_uninterrupted_run(tmp_path, tiny_models, settings):
    """Every rank's environments, open episodes, goal sampler, replay buffer or rollout and random streams are
    checkpointed and restored: stopped and resumed, two ranks in one process give the uninterrupted run's numbers."""
    whole = write_config(tmp_path / "whole" / "run.yaml", tiny_models["tiny-t5"], total_steps=256, ranks=2, **settings)
    train(whole)
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=256, ranks=2, **settings)
    assert train(config, "--stop-at-steps", "136").returncode == 75
    assert "resumed at 136" in train(config).stderr
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(tmp_path / "whole" / "out"))


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


def caught_signals(pid: int) -> int:
    """The mask of signals that process `pid` handles (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)


def test_sigterm_during_start_up_exits_75_and_a_later_run_matches(tmp_path, tiny_models, reference):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    started = time.monotonic()
    process = subprocess.Popen([*TRAIN, "--config", str(config)], stderr=subprocess.PIPE, text=True)
    # SIGTERM as soon as it is handled, or after 1 s at most: torch and transformers are still loading
    while time.monotonic() - started < 1 and not caught_signals(process.pid) & 1 << (signal.SIGTERM - 1):
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 75, stderr[-2000:]
    assert "stopped during start-up, before any step; nothing to checkpoint" in stderr
    out = tmp_path / "out"
    assert not (out / "config.yaml").exists() and not (out / "checkpoints").exists()
    assert train(config).returncode == 0
    assert without_timing(rows(out)) == without_timing(rows(reference["sac_her"]))


def test_ctrl_c_checkpoints_and_exits_75_without_a_traceback(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    process = subprocess.Popen([*TRAIN, "--config", str(config)], stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "metrics.csv"
    deadline = time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.1)  # a row after training steps: there is something to checkpoint
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 75, stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    steps = int(stderr.split("checkpointed at ")[1].split()[0])
    assert (tmp_path / "out" / "checkpoints" / f"ckpt-{steps:09d}.json").exists()


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
    (checkpoints / ".ckpt-000000999.shared.pt.tmp-1").write_bytes(b"junk")  # a killed write
    (tmp_path / "out" / ".done.json.tmp-2").write_bytes(b"junk")
    result = train(config)
    assert result.returncode == 0
    assert f"skipping checkpoint {newest.name.replace('.shared.pt', '.json')}" in result.stderr
    assert "removed .ckpt-000000999.shared.pt.tmp-1, left by a killed write" in result.stderr
    assert not [p for p in (tmp_path / "out").rglob("*") if ".tmp-" in p.name]
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference["sac_her"]))


def as_format(checkpoints: Path, old: int) -> None:
    """Rewrite the newest checkpoint in `checkpoints` as the trainer wrote format `old`: format 2 as its first
    writers left it (a process's one rank at the top of its file, SAC's buffer and PPO's generator alone, no actor
    schedule, statistics without `shown`, no monitor state, resumes, network or checksum); format 1 lacks the
    metrics rows and the thread count. The manifest's SHA-256 follow."""
    manifest_path = sorted(checkpoints.glob("ckpt-*.json"))[-1]
    manifest = json.loads(manifest_path.read_text())
    shared_file, local_file = manifest_path.with_suffix(".shared.pt"), manifest_path.with_suffix(".rank0.pt")
    shared, local = (torch.load(f, weights_only=True) for f in (shared_file, local_file))
    shard = local.pop("shards")[0]
    local |= shard
    del local["monitor"]
    algo = local["algo"]
    if "buffers" in algo:
        algo["buffer"] = algo.pop("buffers")[0]
    if "generators" in algo:
        algo["generator"], algo["segments"] = algo.pop("generators")[0], algo["segments"][0]
    algo["stats"] = algo["stats"]["values"]
    shared["algo"].pop("actor_schedule", None)
    for key in ("resumes", "network", "weights_checksum"):
        del shared["counters"][key]
    shared["format"] = old
    if old == 1:
        del shared["threads"], shared["counters"]["metrics_rows"]
    for path, state in ((shared_file, shared), (local_file, local)):
        torch.save(state, path)
        manifest["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("name, settings", [("sac_her", SAC_HER), ("ppo_clip_her", PPO_CLIP_HER)])
def test_a_checkpoint_of_format_2_resumes_as_an_uninterrupted_run(tmp_path, tiny_models, reference, name, settings):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    assert train(config, "--stop-at-steps", "200").returncode == 75
    as_format(tmp_path / "out" / "checkpoints", 2)
    assert "resumed at 200" in train(config).stderr
    assert without_timing(rows(tmp_path / "out")) == without_timing(rows(reference[name]))
    resumes = json.loads((tmp_path / "out" / "done.json").read_text())["resumes"]
    assert [(r["env_steps"], r["saved"]) for r in resumes] == [(200, None)]  # format 2 did not record the checksum


def test_a_checkpoint_of_format_1_is_refused_naming_the_formats_read(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    assert train(config, "--stop-at-steps", "64").returncode == 75
    as_format(tmp_path / "out" / "checkpoints", 1)
    result = train(config, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "written by another version of the trainer (format 1, this one reads 2, 3)" in result.stderr


def test_checkpoints_of_another_configuration_or_thread_count_are_refused(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    assert train(config, "--stop-at-steps", "64").returncode == 75
    refusals = {
        "seed": (1, "belong to another configuration"),
        "threads": (2, "were made with 1 torch threads, this process has 2, and results depend on it; set threads: 1"),
    }
    for key, (value, message) in refusals.items():
        write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **{**SAC_HER, key: value})
        result = train(config, check=False)
        assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, key


@pytest.mark.parametrize("done", ["another configuration", "corrupt"])
def test_a_finished_directory_refuses_another_configuration(tmp_path, tiny_models, reference, done):
    out = reference["sac_her"]
    if done == "corrupt":
        out = tmp_path / "out"
        out.mkdir()
        (out / "done.json").write_text('{"env_steps": 38')
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "lease"}
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], output_dir=str(out), **{**SAC_HER, "seed": 1})
    result = train(config, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    expected = {
        "another configuration": f"{out} holds a finished run of another configuration (fingerprint ",
        "corrupt": f"{out / 'done.json'} exists but cannot be read (Expecting ',' delimiter: line 1 column 17 "
        f"(char 16)); {runfiles.REBUILD}",
    }[done]
    assert expected in result.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "lease"} == before


HOLD_LEASE = """
import sys, time
from sacglam_core.lease import RunLease
RunLease(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_trainer_on_a_directory_in_use_exits_at_once_naming_the_holder(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = train(config, "--stop-at-steps", "64", check=False)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"error: {out} is in use by pid {holder.pid} on {socket.gethostname()}" in result.stderr
    assert [p.name for p in out.iterdir()] == ["lease"]  # nothing else touched


DRIVER_THAT_WILL_BE_KILLED = """
import os, subprocess, sys, time
with open(sys.argv[1], "ab") as log:
    trainer = subprocess.Popen([*sys.argv[2:], "--driver-pid", str(os.getpid())], stdout=log, stderr=log)
print(trainer.pid, flush=True)
time.sleep(600)
"""


def test_a_trainer_whose_driver_is_killed_checkpoints_and_stops(tmp_path, tiny_models):
    """kill -9 of the local driver leaves its trainer running, re-parented: it notices within a second, checkpoints
    and exits, so that the next invocation resumes the run instead of finding its lease held by an orphan."""
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=100_000, **SAC_HER)
    log = tmp_path / "trainer.log"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_THAT_WILL_BE_KILLED, str(log), *TRAIN, "--config", str(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    trainer = int(driver.stdout.readline())
    checkpoints = tmp_path / "out" / "checkpoints"
    deadline = time.monotonic() + 300
    while not list(checkpoints.glob("ckpt-*.json")):
        assert time.monotonic() < deadline and driver.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 120
    while Path(f"/proc/{trainer}").exists() and "State:\tZ" not in Path(f"/proc/{trainer}/status").read_text():
        assert time.monotonic() < deadline, "the orphaned trainer is still running"
        time.sleep(0.2)
    text = log.read_text()
    assert f"its driver (pid {driver.pid}) is gone: checkpointing and stopping" in text
    stopped_at = int(text.split("checkpointed at ")[1].split(" steps")[0])
    assert stopped_at > 0 and (checkpoints / f"ckpt-{stopped_at:09d}.json").exists()


def test_lost_metrics_rows_are_restored_from_the_checkpoint(tmp_path, tiny_models):
    config = write_config(
        tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=128, eval={"every_steps": 32}, **SAC_HER
    )
    assert train(config, "--stop-at-steps", "64").returncode == 75
    metrics = tmp_path / "out" / "metrics.csv"
    checkpointed = rows(tmp_path / "out")
    assert [int(r["env_steps"]) for r in checkpointed] == [0, 32, 64]
    metrics.unlink()
    assert train(config).returncode == 0
    table = rows(tmp_path / "out")
    assert [int(r["env_steps"]) for r in table] == [0, 32, 64, 96, 128]
    assert table[:3] == checkpointed


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
        ({"algorithm": "sac", "sac": {"batch_size": 0}}, "sac.batch_size: Input should be greater than 0 (got 0)"),
        ({"algorithm": "sac", "sac": {"batch_size": -8}}, "sac.batch_size: Input should be greater than 0 (got -8)"),
        ({"algorithm": "sac", "checkpoint": {"keep": 0}}, "checkpoint.keep: Input should be greater than 0 (got 0)"),
        ({"algorithm": "sac", "sac": {"gamma": 1.5}}, "sac.gamma: Input should be less than or equal to 1 (got 1.5)"),
        ({"algorithm": "ppo", "ppo": {"gamma": 1.5}}, "ppo.gamma: Input should be less than or equal to 1 (got 1.5)"),
        ({"algorithm": "sac", "eval": {"episodes_per_type": 0}}, "eval.episodes_per_type: Input should be greater"),
        ({"algorithm": "sac", "num_envs": 0}, "num_envs: Input should be greater than 0 (got 0)"),
        ({"algorithm": "ppo", "ppo": {"minibatch_size": 0}}, "ppo.minibatch_size: Input should be greater than 0"),
        (
            {"algorithm": "sac", "sac": {"actor_lr": -1e-4}},
            "sac.actor_lr: Input should be greater than 0 (got -0.0001)",
        ),
        ({"algorithm": "ppo", "ppo": {"lr": -1e-4}}, "ppo.lr: Input should be greater than 0 (got -0.0001)"),
        (
            {"algorithm": "sac", "model": {"device": "gpu"}},
            "model.device: must be cpu, cuda, cuda:<n> or auto, got 'gpu'",
        ),
        ({"algorithm": "sac", "threads": -1}, "threads: Input should be greater than 0 (got -1)"),
        ({"algorithm": "sac", "eval": {"every_steps": 0}}, "eval.every_steps: Input should be greater than 0 (got 0)"),
        ({"algorithm": "sac", "checkpoint": {"every_updates": 0}}, "checkpoint.every_updates: Input should be greater"),
        ({"algorithm": "sac", "sac": {"update_every": 0}}, "sac.update_every: Input should be greater than 0 (got 0)"),
        ({"algorithm": "ppo", "ppo": {"rollout_steps": 0}}, "ppo.rollout_steps: Input should be greater than 0"),
        ({"algorithm": "sac", "sac": {"critic_lr": float("nan")}}, "sac.critic_lr: Input should be a finite number"),
        ({"algorithm": "sac", "seed": -1}, "seed: Input should be greater than or equal to 0 (got -1)"),
    ],
)
def test_bad_configuration_fails_at_start_with_one_message(tmp_path, tiny_models, settings, message):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    assert_refused_at_start(train(config, check=False), message, tmp_path / "out")


def assert_refused_at_start(result: subprocess.CompletedProcess, message: str, out: Path) -> None:
    """Exit status 2, one line that says `message`, and nothing written."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1  # one line
    assert not out.exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"algorithm: sac\nseed: 1\nseed: 2\n", "is not valid YAML: key 'seed' appears twice (lines 2 and 3)"),
        (b"sac:\n  gamma: 0.9\n  gamma: 0.8\n", "is not valid YAML: key 'gamma' appears twice (lines 2 and 3)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not a UTF-8 text file (byte 0x89 at offset 0)"),
        (b"- algorithm: sac\n- seed: 1\n", "must be a mapping of settings, got a YAML list"),
        (b"algorithm: sac\nsac: {batch_size: 8\n", "is not valid YAML: "),
    ],
    ids=["duplicate-key", "duplicate-nested-key", "binary", "list", "broken-yaml"],
)
def test_unreadable_configuration_file_fails_at_start_with_one_line(tmp_path, content, message):
    config = tmp_path / "run.yaml"
    config.write_bytes(content)
    assert_refused_at_start(train(config, check=False), f"run configuration {config} {message}", tmp_path / "out")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_cuda_fails_at_start(tmp_path, tiny_models):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], algorithm="sac", model={"device": "cuda"})
    message = "model.device: cuda is not available: this machine has no CUDA device"
    assert_refused_at_start(train(config, check=False), message, tmp_path / "out")


def test_output_dir_that_cannot_be_written_fails_at_start_with_one_line(tmp_path, tiny_models):
    results = tmp_path / "results"
    results.write_text("a file where the results folder should be")
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], algorithm="sac", output_dir=str(results / "r"))
    result = train(config, check=False)
    assert_refused_at_start(
        result, f"error: cannot write to output_dir {results / 'r'}: [Errno 20] Not a directory", results / "r"
    )


@pytest.mark.parametrize("read_only", ["out", "out/checkpoints"])
def test_a_read_only_run_directory_or_checkpoints_folder_fails_at_start_with_one_line(tmp_path, tiny_models, read_only):
    """Refused before the model loads, not at the first checkpoint after minutes of training. Root writes into
    folders without write permission, so as root the folder is made read-only by a read-only bind mount in a
    mount namespace of the trainer's own."""
    folder = tmp_path / read_only
    folder.mkdir(parents=True)
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], algorithm="sac")
    command = [*TRAIN, "--config", str(config)]
    if os.geteuid() == 0:
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
            pytest.skip("root without a mount namespace of its own cannot make a read-only folder")
        mount = f'mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} {folder} && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", mount, "sh", *command]
    else:
        folder.chmod(0o555)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: cannot write to output_dir {tmp_path / 'out'}: ")
    assert str(folder) in result.stderr and not (tmp_path / "out" / "config.yaml").exists()


def test_missing_model_says_how_to_stage_it(tmp_path):
    config = write_config(tmp_path / "run.yaml", tmp_path / "no-such-model", algorithm="sac")
    result = train(config, check=False)
    assert result.returncode == 2 and "python -m sacglam_core.tiny build-tiny" in result.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(config: Path, processes: int = 2) -> subprocess.CompletedProcess:
    """The trainer as `processes` processes on gloo (torchrun), one thread each."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    return subprocess.run(
        [*launcher, "--master_port", str(free_port()), "-m", "sacglam_core.train", "--config", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )


SAC_HER_SMALL_BUFFER = {**SAC_HER, "sac": {**SAC_HER["sac"], "buffer_size": 65}}


@pytest.mark.parametrize("settings", [SAC_HER_SMALL_BUFFER, PPO_CLIP_HER], ids=["sac", "ppo"])
def test_two_ranks_on_gloo_stay_in_sync(tmp_path, tiny_models, settings):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=128, **settings)
    result = torchrun(config)
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
        assert [b["buffers"][0]["size"] for b in buffers] == [33, 32]  # full: each rank added far more than its share


@pytest.mark.parametrize(
    "settings, static",
    [(SAC_HER, False), (PPO_CLIP_HER, False), (SAC_HER, True), (PPO_CLIP_HER, True)],
    ids=["sac", "ppo", "sac-static", "ppo-static"],
)
def test_two_ranks_held_by_one_process_train_as_two_processes_on_gloo(tmp_path, tiny_models, settings, static):
    """`ranks: 2` in one process: each rank's environments, replay buffer and random streams as a process of its
    own would have them, their batches in the same passes. Against the same two ranks as two processes on gloo, the
    same metrics (losses included) and the same trained weights after several updates, within float tolerance (the
    passes add in another order). With static shapes, as a GPU pads its batches (each process widens its own
    prompts), the processes' gradient all-reduces are what a GPU runs between its graphs' pieces."""
    model = {"static_shapes": static}
    together = write_config(
        tmp_path / "one.yaml", tiny_models["tiny-t5"], total_steps=128, ranks=2, model=model, **settings
    )
    train(together)
    apart = write_config(tmp_path / "two.yaml", tiny_models["tiny-t5"], total_steps=128, model=model, **settings)
    apart.write_text(apart.read_text().replace(str(tmp_path / "out"), str(tmp_path / "apart")))
    result = torchrun(apart)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = without_timing(rows(tmp_path / "out")), without_timing(rows(tmp_path / "apart"))
    assert int(one[-1]["updates"]) > 0 and [r["env_steps"] for r in one] == [r["env_steps"] for r in two]
    for a, b in zip(one, two):
        for column in a:
            x, y = float(a[column] or "nan"), float(b[column] or "nan")
            assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-5), (column, x, y)
    done = [json.loads((tmp_path / folder / "done.json").read_text()) for folder in ("out", "apart")]
    assert done[0]["world"] == 1 and done[1]["world"] == 2
    assert int(one[-1]["updates"]) >= (4 if settings["algorithm"] == "sac" else 2)  # PPO: 2 x 4 minibatch steps
    plans = [d["device_plan"] for d in done]
    assert [p["static_shapes"] for p in plans] == [static, static]
    assert [(p["backend"], p["collectives"]) for p in plans] == [(None, "none"), ("gloo", "in the update")]
    assert math.isclose(done[0]["weight_checksums"][0], done[1]["weight_checksums"][0], rel_tol=1e-5)


def test_a_trainer_that_has_ended_ignores_slurms_signals_while_it_exits(reference):
    """SLURM signals every process of the step at the time limit, the trainer too, which may be exiting after its
    last step. CPython's shutdown resets Python-handled signals to their default action, so a USR2 then killed a
    finished trainer (-12) and its attempt was recorded as failed. Ignored signals stay ignored through shutdown."""
    from sacglam_core.train import STOP_SIGNALS, main

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        assert main(["--config", str(reference["sac_her"].parent / "run.yaml")]) == 0  # already finished
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in STOP_SIGNALS)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_monitoring_shows_progress_and_scalars_and_never_changes_results(tmp_path, tiny_models, reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    quiet = {"tensorboard": False, "progress_every_steps": 64}
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER, monitor=quiet)
    result = train(config)
    out = config.parent / "out"
    assert without_timing(rows(out)) == without_timing(rows(reference["sac_her"]))  # the reference wrote TensorBoard
    assert not (out / "tensorboard").exists()
    lines = [line for line in result.stderr.splitlines() if "/384 steps (" in line]
    assert [line.split(": ", 1)[1].split(" steps")[0] for line in lines] == [f"{n}/384" for n in range(64, 385, 64)]
    pattern = r"\d+\.\d\d steps/s, (training success \d\.\d{3} over \d+ episodes|no episode ended), evaluation "
    pattern += r"\d\.\d{3} at 384, ETA"
    assert re.search(pattern, lines[-1]) and lines[-1].endswith("ETA done"), lines[-1]
    progress = json.loads((out / runfiles.PROGRESS).read_text())
    assert progress["env_steps"] == 384 and progress["pid"] and progress["gpus"] == 0
    for name, expected in {
        "sac_her": {"critic_loss", "actor_loss", "alpha", "entropy", "mean_q", "q_range", "success", "env_steps_per_s"},
        "ppo_clip_her": {"policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "success", "updates"},
    }.items():
        events = EventAccumulator(str(reference[name] / "tensorboard")).Reload()
        tags = set(events.Tags()["scalars"])
        assert {f"train/{tag}" for tag in expected} | {"eval/success", "eval/success_test"} <= tags, tags
        steps = [event.step for event in events.Scalars("train/env_steps_per_s")]
        assert steps == sorted(steps) and len(steps) >= 40  # every step of 8 environments: 0.5% of 384 steps
        evaluations = [(event.step, round(event.value, 6)) for event in events.Scalars("eval/success")]
        assert evaluations == [(int(r["env_steps"]), round(float(r["eval_success"]), 6)) for r in rows(reference[name])]


def test_wandb_without_the_package_fails_at_start_with_one_line(tmp_path, tiny_models):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **PPO_KL, monitor={"wandb": "offline"})
    result = train(config, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: {config}: monitor.wandb: offline needs wandb: pip install -e '.[wandb]'"
    ]


@pytest.mark.slow
def test_wandb_offline_writes_a_run_for_wandb_sync_and_the_same_metrics(tmp_path, tiny_models):
    """With the optional extra's wandb (installed here beside the project's packages, which win)."""
    target = tmp_path / "wandb-packages"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "wandb==0.31.0"]
    subprocess.run(install, check=True, capture_output=True, timeout=1800)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(target)!r})\n")
    env = {**os.environ, "PYTHONPATH": str(hook), "WANDB_SILENT": "true"}
    outs = {}
    for name, monitor in {"wandb": {"wandb": "offline"}, "plain": {"tensorboard": False}}.items():
        config = write_config(tmp_path / name / "run.yaml", tiny_models["tiny-t5"], **PPO_KL, monitor=monitor)
        result = subprocess.run([*TRAIN, "--config", str(config)], env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        outs[name] = config.parent / "out"
    assert list((outs["wandb"] / "wandb").glob("offline-run-*/run-*.wandb"))  # what `wandb sync` uploads
    assert without_timing(rows(outs["wandb"])) == without_timing(rows(outs["plain"]))


def test_the_progress_line_says_what_compiling_cost_this_run_alone(tmp_path, tiny_models, capsys):
    """With `model.compile`, the progress lines and done.json give the run's compile time; a later run in the same
    process that compiles nothing says nothing of it (the process's count includes the earlier run's)."""
    from sacglam_core.config import load_config
    from sacglam_core.trainer import Trainer

    # few steps: the CPU's batches take their own shapes, and each new one compiles (a minute or two, cold)
    settings = {"total_steps": 16, "eval": {"every_steps": 16, "episodes_per_type": 1, "test_episodes": 1}}
    monitor = {"tensorboard": False, "progress_every_steps": 8}
    for name, compiled in (("compiled", True), ("eager", False)):
        config = write_config(tmp_path / name / "run.yaml", tiny_models["tiny-t5"], **PPO_KL, **settings,
                              model={"compile": compiled}, monitor=monitor)  # fmt: skip
        assert Trainer(load_config(config)).run() == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if "/16 steps (" in line]
        seconds = json.loads((config.parent / "out" / runfiles.DONE).read_text())["compile_seconds"]
        assert len(lines) == 2
        if compiled:
            spent = r", 0 graphs captured, capture\+compile \d+ (s|min), ETA"  # minutes with a cold inductor cache
            assert seconds > 0 and all(re.search(spent, x) for x in lines), lines
        else:
            assert seconds == 0 and not any("capture+compile" in x for x in lines), lines
