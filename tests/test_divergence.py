"""A run that diverges says so in one line and an exit status of its own, never checkpoints non-finite state, and
the workflow does not train it again."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import write_config

from sacglam_core import EXIT_DIVERGED, runfiles

TRAIN = [sys.executable, "-m", "sacglam_core.train"]
LINE = re.compile(
    r"^error: (?P<run>\S+): training diverged at (update|minibatch step) (?P<update>\d+) \(step (?P<step>[\d,]+)\): "
    r"(?P<what>.*(nan|inf).*); (last finite checkpoint at step (?P<checkpoint>[\d,]+)|no checkpoint was written)$"
)
# Learning rates far too high: Adam moves every weight by about lr a step, and after a few updates a pass overflows.
SAC = {
    "algorithm": "sac",
    "total_steps": 512,
    "sac": {"batch_size": 16, "update_every": 16, "updates_per_cycle": 1, "warmup_cycles": 0, "critic_lr": 1e3,
            "actor_lr": 1e3, "critic": {"input": "decoded_action", "hidden_units": 32}},
    "checkpoint": {"every_updates": 1, "keep": 100},
}  # fmt: skip
PPO = {
    "algorithm": "ppo",
    "total_steps": 1024,
    "ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32, "lr": 5.0},  # 1e1 diverges in the first update
    "checkpoint": {"every_updates": 1, "keep": 100},
}


def train(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, "--config", str(config)], capture_output=True, text=True, timeout=600)


def finite(path: Path) -> bool:
    """Whether every floating tensor of a checkpoint file is finite."""
    tensors = []

    def collect(value) -> None:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list | tuple):
            for item in value:
                collect(item)

    collect(torch.load(path, weights_only=True))
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


@pytest.mark.parametrize("settings", [SAC, PPO], ids=["sac", "ppo"])
def test_a_diverging_run_stops_in_one_line_keeps_finite_checkpoints_and_resumes_from_the_last(
    tmp_path, tiny_models, settings
):
    """Checkpoints every update, so divergence comes right before a checkpoint boundary: the run stops there with
    status 3 and one line naming the update, the step, what went non-finite and the last finite checkpoint, which
    every checkpoint left is; started again it resumes from that checkpoint and diverges the same way."""
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], **settings)
    first = train(config)
    assert first.returncode == EXIT_DIVERGED, first.stderr[-3000:]
    line = first.stderr.strip().splitlines()[-1]
    match = LINE.match(line)
    assert match, line
    out = tmp_path / "out"
    record = runfiles.diverged(out)
    assert record is not None and line == f"error: {out}: {record['message']}"
    assert not (out / "done.json").exists()
    checkpoints = sorted((out / "checkpoints").glob("ckpt-*.pt"))
    assert checkpoints and all(finite(path) for path in checkpoints)  # nothing non-finite was ever written
    newest = runfiles.progress(out)
    assert match["checkpoint"] is not None and int(match["checkpoint"].replace(",", "")) == newest.steps
    assert int(match["step"].replace(",", "")) >= newest.steps

    (out / runfiles.DIVERGED).unlink()  # the user's retry, by hand
    again = train(config)
    assert again.returncode == EXIT_DIVERGED
    assert f"resumed at {newest.steps} environment steps" in again.stderr
    assert again.stderr.strip().splitlines()[-1] == line  # the same mathematics from the same checkpoint


def test_the_workflow_does_not_train_a_diverged_run_again(tmp_path):
    """The driver refuses it without submitting anything; status shows where it diverged; the budget plans no
    hours for it."""
    from sacglam_core.jobs import budget as budgeting
    from sacglam_core.jobs import driver as driving
    from sacglam_core.jobs import status
    from sacglam_core.pipeline.config import parse_workflow_config
    from sacglam_core.pipeline.experiments import expand, load_definitions

    root = Path(__file__).resolve().parents[1]
    definitions = load_definitions(root / "workflow" / "config" / "experiments.yaml")
    run = expand(definitions, ["smoke"], tmp_path / "results", {"models": str(tmp_path)})[0]
    run.directory.mkdir(parents=True)
    message = "training diverged at update 3 (step 96): critic loss nan; last finite checkpoint at step 64"
    (run.directory / runfiles.DIVERGED).write_text(json.dumps({"message": message, "env_steps": 96, "checkpoint": 64}))
    settings = parse_workflow_config({"experiments": ["smoke"], "results": str(tmp_path / "results"),
                                      "launcher": {"executor": "local", "gpus_per_node": 0}})  # fmt: skip
    with pytest.raises(driving.RunFailed, match=f"{re.escape(message)}. Not trained again while diverged.json"):
        driving.Driver(settings).train(run, run.directory / runfiles.MARKER, run.directory / "driver.log")
    assert not (run.directory / "trainer.log").exists()  # nothing started
    shown = status.status_of(run, None)
    assert shown.state == "diverged" and shown.note == message and shown.next_launch == "diverged"
    calibration = budgeting.load_calibration(root / "workflow" / "config" / "calibration.yaml", tmp_path)
    (estimate,) = budgeting.estimate([run], 0, "cpu", calibration)
    assert estimate.status == "diverged" and estimate.remaining_steps == 0
