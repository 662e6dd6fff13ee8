"""The one-command GPU check: the rates file it writes, read back by the budget (without a GPU), and its logic run on
this CPU with the tiny T5 and `--small` (heavy: `pytest -m heavy`, 3 min on 2 cores; 4-bit weights compute slowly on
a CPU)."""

import datetime
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from sacglam_core.benchmarks.gpu_check import Figures, write_rates
from sacglam_core.pipeline import budget as budgeting
from sacglam_core.pipeline.experiments import expand, load_definitions

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = [sys.executable, "-m", "sacglam_core.benchmarks.gpu_check", "--device=cpu"]


@pytest.mark.heavy
def test_gpu_check_trains_both_algorithms_on_a_cpu_and_writes_their_rates(tiny_models, tmp_path):
    # 240 steps: 3 PPO updates of `--small`'s 64-step rollouts, SAC's 2 updates of 64 every 8 steps once the
    # buffer holds 64 transitions (warm-up off: the actor too); LoRA and 4-bit weights; bfloat16 only scored.
    rates = tmp_path / "rates.yaml"
    command = [*GPU_CHECK, "--steps=240", "--small", "--model", str(tiny_models["tiny-t5"]), "--rates", str(rates)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "1 CPU thread(s)" in out and "dtype auto picks float32; also checked: bfloat16 (scoring only)" in out
    rows = re.findall(
        r"^\| (SAC-GLAM\+HER|PPO-GLAM) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| n/a \(CPU\) \| - \| [\d.]+ \| [\d.]+ "
        r"\| LoRA trained, losses finite \|$",
        out,
        re.M,
    )
    assert [r[0] for r in rows] == ["SAC-GLAM+HER", "PPO-GLAM"]  # trained in the auto dtype only
    assert all(float(steady) > 0 and float(whole) > 0 and float(updates) > 0 for _, steady, whole, updates in rows)
    assert out.count("prompts/s") == 2 and f"rates written to {rates}\n" in out
    assert out.rstrip().endswith("all checks passed")
    (measurement,) = yaml.safe_load(rates.read_text())["measurements"]
    speeds = measurement["env_steps_per_s"]
    assert measurement["dtype"] == "float32" and set(speeds) == {"sac+her", "ppo"}
    steady = [speeds["sac+her"]["steady"], speeds["ppo"]["steady"]]
    assert steady == pytest.approx([float(r[1]) for r in rows], abs=0.05)  # the table's are rounded to 0.1


def test_gpu_check_refuses_a_run_too_short_for_ppo_to_update():
    # At or under the rollout's length PPO never updates, so its "LoRA trained" check would fail for that alone.
    result = subprocess.run(
        [*GPU_CHECK, "--steps=64", "--small"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "--steps must exceed PPO's rollout of 64 steps" in result.stderr.splitlines()[-1]


def test_a_bad_rates_file_stops_gpu_check_before_it_measures(tmp_path):
    rates = tmp_path / "H100.yaml"
    rates.write_text("gpu: H100\nmeasurements: []\n")
    command = [*GPU_CHECK, "--steps=72", "--small", "--rates", str(rates)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "gpu_check:" not in result.stdout  # nothing built or measured
    assert result.stderr.splitlines()[-1] == (
        f"error: {rates}: measurements: List should have at least 1 item after validation, not 0"
    )


def test_measured_figures_become_the_rates_file_the_budget_prices_from(tmp_path):
    """What gpu_check does after its runs, with figures as a GPU would measure them: the rates file (steady and
    whole-run rates, GPU, dtype, weights, critic, versions, commit, date, command), which the budget reads."""
    table = tmp_path / "calibration.yaml"
    table.write_text((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    path = tmp_path / "gpu_rates" / "H100.yaml"
    sac = Figures(steady=3.8, whole_run=5.6, updates_per_s=0.95, busy=0.21, peak_memory_gib=9.2, tflops=13.4)
    ppo = Figures(steady=8.9, whole_run=9.0, updates_per_s=0.02, busy=0.08, peak_memory_gib=7.2, tflops=5.1)
    command = "python -m sacglam_core.benchmarks.gpu_check"
    write_rates(path, "H100", "NVIDIA H100 80GB HBM3", {"bfloat16": {"sac+her": sac, "ppo": ppo}}, command, "N.")
    (measurement,) = yaml.safe_load(path.read_text())["measurements"]
    assert measurement["env_steps_per_s"] == {"sac+her": {"steady": 3.8, "whole_run": 5.6},
                                              "ppo": {"steady": 8.9, "whole_run": 9.0}}  # fmt: skip
    assert {k: measurement[k] for k in ("dtype", "load_in_4bit", "critic", "device_name", "command")} == {
        "dtype": "bfloat16", "load_in_4bit": True, "critic": "obs_action", "device_name": "NVIDIA H100 80GB HBM3",
        "command": command,
    }  # fmt: skip
    assert measurement["torch"] == torch.__version__ and measurement["transformers"] == transformers.__version__
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", measurement["commit"])  # this checkout's
    assert measurement["date"] == datetime.date.today()
    achieved = "sac+her: 13.4 TFLOP/s, GPU busy 21%, 9.2 GiB; ppo: 5.1 TFLOP/s, GPU busy 8%, 7.2 GiB"
    assert measurement["notes"] == f"N. {achieved}."
    assert sorted(p.name for p in path.parent.iterdir()) == ["H100.yaml"]  # written under a temporary name, renamed

    runs = expand(load_definitions(ROOT / "workflow" / "config" / "experiments.yaml"), ["main"], tmp_path / "results")
    calibration = budgeting.load_calibration(table, tmp_path / "results")
    priced = {e.run.variant: (e.rate, e.source) for e in budgeting.estimate(runs, 4, "H100", calibration)}
    today = datetime.date.today()
    assert priced["SAC-GLAM+HER"] == (pytest.approx(3.8 * 3600), f"gpu_check measured {today}")
    assert priced["PPO-GLAM"] == (pytest.approx(8.9 * 3600), f"gpu_check measured {today}")

    # float16's measurement joins bfloat16's; a steady state the run did not reach leaves the whole run's rate
    late = Figures(steady=float("nan"), whole_run=6.0, updates_per_s=float("nan"), busy=0.2, peak_memory_gib=9.0,
                   tflops=float("nan"))  # fmt: skip
    write_rates(path, "H100", "NVIDIA H100 80GB HBM3", {"float16": {"sac+her": late}}, command, "N.")
    measurements = yaml.safe_load(path.read_text())["measurements"]
    assert [m["dtype"] for m in measurements] == ["bfloat16", "float16"]
    assert measurements[1]["env_steps_per_s"] == {"sac+her": {"steady": None, "whole_run": 6.0}}
    # measuring bfloat16 again replaces its measurement
    write_rates(path, "H100", "NVIDIA H100 80GB HBM3", {"bfloat16": {"sac+her": late}}, command, "N.")
    measurements = yaml.safe_load(path.read_text())["measurements"]
    assert [m["dtype"] for m in measurements] == ["float16", "bfloat16"]
    her = next(run for run in runs if run.variant == "SAC-GLAM+HER")
    rate, source = budgeting.load_calibration(table, tmp_path / "results").rate(her.config, "H100")
    assert rate == pytest.approx(6.0 * 3600) and source == f"gpu_check measured {today}, whole run"
