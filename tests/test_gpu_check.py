"""The one-command GPU check, its logic run on this CPU with the tiny T5 and `--small` (heavy: `pytest -m heavy`;
4-bit weights compute slowly on a CPU: 12 min 50 s on 2 busy cores, outside CI's budget)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.heavy
def test_gpu_check_trains_both_algorithms_in_both_dtypes_on_a_cpu(tiny_models):
    # 240 steps: 3 PPO updates of `--small`'s 64-step rollouts, SAC's 2 updates of 64 every 8 steps once the
    # buffer holds 64 transitions, its actor after the warm-up; LoRA and 4-bit weights.
    command = [sys.executable, "-m", "sacglam_core.benchmarks.gpu_check", "--device=cpu", "--steps=240", "--small"]
    result = subprocess.run(
        [*command, "--model", str(tiny_models["tiny-t5"])], cwd=ROOT, capture_output=True, text=True, timeout=1500
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "1 CPU thread(s)" in out and "dtype auto picks float32; also checked: bfloat16" in out
    rows = re.findall(
        r"^\| (SAC-GLAM\+HER|PPO-GLAM) \| ([\d.]+) \| ([\d.]+) \| .*\| LoRA trained, losses finite \|$", out, re.M
    )
    assert [r[0] for r in rows] == ["SAC-GLAM+HER", "PPO-GLAM"] * 2  # both variants, in both dtypes
    assert all(float(steps_per_s) > 0 and float(updates_per_s) > 0 for _, steps_per_s, updates_per_s in rows)
    assert out.count("prompts/s") == 2 and out.rstrip().endswith("all checks passed")


def test_gpu_check_refuses_a_run_too_short_for_ppo_to_update():
    # At or under the rollout's length PPO never updates, so its "LoRA trained" check would fail for that alone.
    command = [sys.executable, "-m", "sacglam_core.benchmarks.gpu_check", "--device=cpu", "--steps=64", "--small"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--steps must exceed PPO's rollout of 64 steps" in result.stderr.splitlines()[-1]
