"""The first job's checks (sacglam_core/pipeline/gpu_smoke.py) on run directories as a cluster job leaves them."""

import json

import pytest
import yaml

from sacglam_core.pipeline import gpu_smoke

PINNED = {"google/flan-t5-base": "7bcac572ce56db69c1ea7c8af255c5d7c9672fc2"}
GOOD = {
    "env_steps": 1024,
    "container": "/scratch/sacglam/resources/sacglam.sif",
    "model_commit": PINNED["google/flan-t5-base"],
    "hub_offline": True,
    "gpus": 1,
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "dtype": "bfloat16",
    "lora_b_norm": 0.0213,
}
ATTEMPTS = [
    {"exit_status": 75, "restart_count": 0},
    {"exit_status": 0, "restart_count": 1},
]


def run_dir(tmp_path, done=GOOD, attempts=ATTEMPTS):
    (tmp_path / "done.json").write_text(json.dumps(done))
    config = {"model": {"name_or_path": "google/flan-t5-base"}, "checkpoint": {"drill_at_steps": 512}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    return tmp_path


def test_a_job_that_ran_as_a_campaign_runs_passes_every_check(tmp_path):
    results = gpu_smoke.checks(run_dir(tmp_path), PINNED)
    assert [name for name, _, _ in results] == [
        "image",
        "staged model",
        "GPU",
        "dtype",
        "LoRA trained",
        "checkpoint and requeue",
    ]
    assert all(passed for _, passed, _ in results), results


@pytest.mark.parametrize(
    "change, attempts, failing",
    [
        ({"container": None}, ATTEMPTS, "image"),
        ({"model_commit": "0" * 40}, ATTEMPTS, "staged model"),
        ({"hub_offline": False}, ATTEMPTS, "staged model"),
        ({"gpus": 0, "gpu_name": None}, ATTEMPTS, "GPU"),
        ({"dtype": "float32"}, ATTEMPTS, "dtype"),
        ({"lora_b_norm": 0.0}, ATTEMPTS, "LoRA trained"),
        ({"lora_b_norm": None}, ATTEMPTS, "LoRA trained"),
        ({}, [{"exit_status": 0, "restart_count": 0}], "checkpoint and requeue"),  # never stopped: no drill
        (
            {},
            [{"exit_status": 75, "restart_count": 0}, {"exit_status": 0, "restart_count": 0}],
            "checkpoint and requeue",
        ),
    ],
)
def test_each_check_fails_alone_on_what_it_checks(tmp_path, change, attempts, failing):
    results = gpu_smoke.checks(run_dir(tmp_path, {**GOOD, **change}, attempts), PINNED)
    assert [name for name, passed, _ in results if not passed] == [failing]
