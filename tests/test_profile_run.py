"""The profiling benchmark runs end to end and its operator table reads one SAC update cycle."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def profile(tiny_models, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sacglam_core.benchmarks.profile_run", "--experiment", "smoke"]
    command += ["--models", str(tiny_models["tiny-t5"].parent), "--steps", "256", "--top", "3", *extra]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_operators_of_one_sac_update_cycle(tiny_models):
    result = profile(tiny_models, "--variant", "SAC-GLAM+HER", "--ops", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "smoke / SAC-GLAM+HER: 256 environment steps" in result.stdout
    table = result.stdout.split("torch operators of one SAC update cycle")[1]
    rows = re.findall(r"^  (.+?)\s+([\d.]+) ms\s+([\d.]+) %\s+(\d+) calls(?:\s+([\d.]+) GFLOP/s)?$", table, re.M)
    assert len(rows) == 5 and "aten::mm" in {name for name, *_ in rows}  # the LLM's matrix products
    times = [float(ms) for _, ms, _, _, _ in rows]
    assert times == sorted(times, reverse=True) and sum(float(share) for _, _, share, _, _ in rows) <= 100.5
    assert all(float(rate) > 0 for name, *_, rate in rows if name == "aten::mm")  # FLOPs counted for products
    products = r"matrix products \((.+)\): ([\d.]+) GFLOP in (\d+) ms .*, ([\d.]+) GFLOP/s; .*: ([\d.]+) GFLOP/s"
    summary = re.search(products, table)
    assert summary and "aten::mm" in summary[1] and float(summary[2]) > 0 and float(summary[5]) > 0


def test_operators_are_refused_for_ppo(tiny_models):
    result = profile(tiny_models, "--variant", "PPO-GLAM", "--ops", "5")
    assert result.returncode == 2 and "--ops profiles a SAC update; PPO-GLAM is ppo" in result.stderr
