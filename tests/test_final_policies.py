"""The final-policy study loads the run's own final policy (its sampled success is the logged one) and
names what is wrong with a run it cannot read."""

import shutil

import pytest
from tiny_runs import write_config

from sacglam_core.config import load_config
from sacglam_core.studies.final_policies import final_success, main
from sacglam_core.trainer import Trainer


def finished_run(tmp_path, model, algorithm: str):
    """A 64-step run of `algorithm` with a checkpoint at every update; its output directory."""
    updates = {
        "sac": {"sac": {"batch_size": 8, "update_every": 16, "warmup_updates": 2, "critic": {"hidden_units": 32}}},
        "ppo": {"ppo": {"rollout_steps": 32, "epochs": 1, "minibatch_size": 16}},
    }[algorithm]
    config = write_config(
        tmp_path / "run.yaml",
        model,
        algorithm=algorithm,
        total_steps=64,
        eval={"every_steps": 32},
        checkpoint={"every_updates": 1},
        **updates,
    )
    assert Trainer(load_config(config)).run() == 0
    return tmp_path / "out"


@pytest.mark.parametrize("algorithm", ["sac", "ppo"])
def test_the_sampled_success_is_the_runs_last_evaluation(tmp_path, tiny_models, algorithm):
    run = finished_run(tmp_path, tiny_models["tiny-causal"], algorithm)
    success = final_success(run, None)  # exits with an error if it differs from metrics.csv's last row
    expected = {"sampled", "greedy actor"} | ({"argmax Q"} if algorithm == "sac" else set())
    assert set(success) == expected
    assert all(0.0 <= v <= 1.0 for v in success.values())
    more = final_success(run, 8)
    assert set(more) == set(success)


def test_a_run_without_checkpoints_or_not_finished_is_refused(tmp_path, tiny_models):
    run = finished_run(tmp_path, tiny_models["tiny-causal"], "sac")
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(run / "config.yaml", empty / "config.yaml")
    with pytest.raises(SystemExit, match="has no checkpoint"):
        final_success(empty, None)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("total_steps: 64", "total_steps: 128"))
    with pytest.raises(SystemExit, match=r"has not finished \(64 of 128 steps\)"):
        final_success(run, None)


def test_a_directory_that_is_not_a_run_gets_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"error: cannot read run configuration .*config.yaml"):
        main([str(tmp_path)])
