"""TensorBoard after a kill -9 and a restart: one point per step, the evaluations of metrics.csv and every value of an
uninterrupted run but the wall-clock rate, as TensorBoard itself reads the event files (purges applied)."""

import csv
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_runs import write_config

from sacglam_core.algos.stats import UpdateStats
from sacglam_core.checkpoint import upgrade

TRAIN = [sys.executable, "-m", "sacglam_core.train"]

# With these settings SAC checkpoints at 64, 96, 128, 160, ... (every 4 updates): 64 falls between two training points
# (every 40 steps), 160 on a training point and an evaluation (every 80 steps).
SAC_HER = {
    "algorithm": "sac",
    "sac": {"batch_size": 16, "update_every": 16, "critic": {"input": "decoded_action", "hidden_units": 32}},
    "her": {"enabled": True},
    "eval": {"every_steps": 80},
    "monitor": {"scalars_every_steps": 40},
}
PPO = {
    "algorithm": "ppo",
    "total_steps": 256,
    "ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32},
    "checkpoint": {"every_updates": 1000},  # none before the end
}
PPO_HER = {**PPO, "ppo": {**PPO["ppo"], "center_clip": True}, "her": {"enabled": True, "aligned_only": True}}
RATE = "train/env_steps_per_s"  # wall-clock timing


def train(config: Path) -> str:
    result = subprocess.run([*TRAIN, "--config", str(config)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def kill_when(config: Path, ready) -> None:
    """Start the trainer and kill -9 it as soon as `ready()` holds."""
    process = subprocess.Popen([*TRAIN, "--config", str(config)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert process.poll() is None, "the trainer ended before it was killed"
            assert time.monotonic() < deadline, "the trainer was not ready to be killed in 5 minutes"
            time.sleep(0.01)
    finally:
        process.kill()
        process.wait()


def evaluation_steps(out: Path) -> list[int]:
    with (out / "metrics.csv").open() as f:
        return [int(row["env_steps"]) for row in csv.DictReader(f)]


def scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) points as TensorBoard shows them."""
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def assert_one_point_per_step(out: Path) -> dict[str, list[tuple[int, float]]]:
    """Strictly increasing steps in every tag, those of metrics.csv in the evaluations'; returns the points."""
    shown = scalars(out)
    for tag, points in shown.items():
        steps = [step for step, _ in points]
        assert all(a < b for a, b in zip(steps, steps[1:])), f"{tag}: steps {steps}"
    evaluations = evaluation_steps(out)
    assert "eval/success" in shown
    for tag in (tag for tag in shown if tag.startswith("eval/")):
        assert [step for step, _ in shown[tag]] == evaluations, tag
    return shown


def assert_shows_the_uninterrupted_run(out: Path, reference: Path) -> None:
    shown, expected = assert_one_point_per_step(out), scalars(reference)
    assert [step for step, _ in shown.pop(RATE)] == [step for step, _ in expected.pop(RATE)]
    assert shown == expected


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_models):
    """Uninterrupted runs, one per setting."""
    runs = {}
    for name, settings in {"sac_her": SAC_HER, "ppo": PPO, "ppo_her": PPO_HER}.items():
        config = write_config(tmp_path_factory.mktemp(name) / "run.yaml", tiny_models["tiny-t5"], **settings)
        train(config)
        runs[name] = config.parent / "out"
    return runs


def test_killed_before_the_first_checkpoint_and_started_afresh(tmp_path, tiny_models, reference):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **PPO)
    metrics = tmp_path / "out" / "metrics.csv"
    kill_when(config, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)  # 2 rows
    assert not (tmp_path / "out" / "checkpoints").exists()
    assert list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert "resumed" not in train(config)
    assert_shows_the_uninterrupted_run(tmp_path / "out", reference["ppo"])


@pytest.mark.parametrize(
    "checkpoint", [64, 160], ids=["between-training-points", "on-a-training-point-and-an-evaluation"]
)
def test_killed_just_after_a_checkpoint_and_resumed(tmp_path, tiny_models, reference, checkpoint):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    checkpoints = tmp_path / "out" / "checkpoints"
    kill_when(config, (checkpoints / f"ckpt-{checkpoint:09d}.json").exists)
    # the kill comes within milliseconds, before the next checkpoint, unless this machine stalled the test meanwhile:
    # then it resumes from that one, still a kill just after a checkpoint
    newest = max(int(path.stem.split("-")[1]) for path in checkpoints.glob("ckpt-*.json"))
    assert f"resumed at {newest} environment steps" in train(config)
    assert_shows_the_uninterrupted_run(tmp_path / "out", reference["sac_her"])


def test_resuming_a_checkpoint_without_the_monitors_state(tmp_path, tiny_models, reference):
    """A checkpoint of format 2 from before the monitor's state and the shown statistics were kept resumes as before
    (training points may differ from the uninterrupted run's), with one point per step and the same evaluations."""
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **SAC_HER)
    manifest = tmp_path / "out" / "checkpoints" / "ckpt-000000096.json"
    kill_when(config, manifest.exists)
    for later in manifest.parent.glob("ckpt-*"):  # written meanwhile if this machine stalled the test
        if int(later.name.split(".")[0].split("-")[1]) > 96:
            later.unlink()
    local, shared = manifest.with_suffix(".rank0.pt"), manifest.with_suffix(".shared.pt")
    state, common = torch.load(local, weights_only=True), torch.load(shared, weights_only=True)
    del state["monitor"]
    state["algo"]["stats"] = state["algo"]["stats"]["values"]
    common["format"] = 2  # what a checkpoint without them was
    listing = json.loads(manifest.read_text())
    for path, content in ((local, state), (shared, common)):
        torch.save(content, path)
        listing["files"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(listing))
    assert "resumed at 96 environment steps" in train(config)
    shown, expected = assert_one_point_per_step(tmp_path / "out"), scalars(reference["sac_her"])
    assert {tag: p for tag, p in shown.items() if tag.startswith("eval/")} == {
        tag: p for tag, p in expected.items() if tag.startswith("eval/")
    }


def test_her_share_is_shown_exactly_with_her(reference):
    assert "train/her_share" in scalars(reference["sac_her"])
    assert "train/her_share" in scalars(reference["ppo_her"])
    assert "train/her_share" not in scalars(reference["ppo"])


def test_update_statistics_resume_with_what_the_monitor_has_not_shown():
    stats = UpdateStats()
    stats.add(loss=1.0)
    assert stats.unseen() == {"loss": 1.0}
    stats.add(loss=3.0)
    resumed = UpdateStats()
    resumed.load_state_dict(stats.state_dict())
    assert resumed.unseen() == {"loss": 3.0} and resumed.pop() == {"loss": 2.0}
    old = UpdateStats()  # a checkpoint of format 2 from before `shown` was kept, as checkpoint.upgrade reads it
    shared = {"format": 2, "algo": {}, "counters": {}}
    _, local = upgrade(shared, {"shards": [], "algo": {"stats": {"loss": [1.0, 3.0]}}}, Path("checkpoints"))
    old.load_state_dict(local["algo"]["stats"])
    assert old.unseen() == {} and old.pop() == {"loss": 2.0}
