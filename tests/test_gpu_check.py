"""The one-command GPU check: the rates file it writes, read back by the budget (without a GPU), and its logic run on
this CPU with the tiny T5 and `--small` (heavy: `pytest -m heavy`, 3 min on 2 cores; 4-bit weights compute slowly on
a CPU)."""

import datetime
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from sacglam_core.benchmarks.gpu_check import WEIGHTS, Figures, run_config, write_rates
from sacglam_core.jobs import budget as budgeting
from sacglam_core.jobs import gpu_rates
from sacglam_core.pipeline.experiments import expand, load_definitions

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = [sys.executable, "-m", "sacglam_core.benchmarks.gpu_check", "--device=cpu"]


@pytest.mark.heavy
def test_gpu_check_trains_both_algorithms_on_a_cpu_and_writes_their_rates(tiny_models, tmp_path):
    # 240 steps: 3 PPO updates of `--small`'s 64-step rollouts, SAC's 2 updates of 64 every 8 steps once the
    # buffer holds 64 transitions (warm-up off: the actor too); LoRA and 4-bit weights; eager only on a CPU.
    rates = tmp_path / "rates.yaml"
    command = [*GPU_CHECK, "--steps=240", "--small", "--model", str(tiny_models["tiny-t5"]), "--rates", str(rates),
               "--variants", "SAC-GLAM+HER,PPO-GLAM"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "1 CPU thread(s)" in out and "dtype float32, 4-bit weights, LoRA; modes eager" in out
    rows = re.findall(r"^\| (SAC-GLAM\+HER|PPO-GLAM) \| eager \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|.*\| LoRA trained, "
                      r"losses finite \|$", out, re.M)  # fmt: skip
    assert [r[0] for r in rows] == ["SAC-GLAM+HER", "PPO-GLAM"]
    # each run's rates are printed as soon as its measured steps end, before profiling: a run cut short keeps them
    early = re.findall(r"^(SAC-GLAM\+HER|PPO-GLAM)-eager: 240 steps measured: steady ([\d.]+) env steps/s", out, re.M)
    assert early == [(r[0], r[1]) for r in rows]
    assert all(float(steady) > 0 and float(whole) > 0 and float(updates) > 0 for _, steady, whole, updates in rows)
    assert f"rates written to {rates}\n" in out and out.rstrip().endswith("all checks passed")
    (measurement,) = yaml.safe_load(rates.read_text())["measurements"]
    speeds = measurement["env_steps_per_s"]
    assert measurement["dtype"] == "float32" and set(speeds) == {"sac+her", "ppo"}
    steady = [speeds["sac+her"]["steady"], speeds["ppo"]["steady"]]
    assert steady == pytest.approx([float(r[1]) for r in rows], abs=0.05)  # the table's are rounded to 0.1


def test_gpu_check_refuses_a_run_too_short_for_a_steady_ppo_cycle():
    # PPO's steady window is the cycles after its first: a run shorter than two rollouts has none.
    result = subprocess.run(
        [*GPU_CHECK, "--steps=64", "--small"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "--steps must be at least twice PPO's rollout of 64 steps" in result.stderr.splitlines()[-1]


def test_a_bad_rates_file_stops_gpu_check_before_it_measures(tmp_path):
    rates = tmp_path / "H100.yaml"
    rates.write_text("gpu: H100\nmeasurements: []\n")
    command = [*GPU_CHECK, "--steps=128", "--small", "--rates", str(rates)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "gpu_check:" not in result.stdout  # nothing built or measured
    assert result.stderr.splitlines()[-1] == (
        f"error: {rates}: measurements: List should have at least 1 item after validation, not 0"
    )


def test_measured_figures_become_the_rates_file_the_budget_prices_from(tmp_path):
    """What gpu_check does after its runs, with figures as a GPU would measure them: the rates file (steady and
    whole-run rates of the default mode, compiled, or of another where compiled reached no steady state; the other
    modes' beside them in the notes; GPU, dtype, weights, critic, ranks per GPU, versions, commit, date, command),
    which the budget reads."""
    table = tmp_path / "calibration.yaml"
    table.write_text((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    path = tmp_path / "gpu_rates" / "H100.yaml"
    runs = {
        ("SAC-GLAM+HER", "eager"): Figures(steady=3.8, whole_run=5.6, updates_per_s=0.95, tflops=13.4, busy=0.21),
        ("SAC-GLAM+HER", "captured"): Figures(steady=9.0, whole_run=20.0, updates_per_s=2.2, tflops=30.1, busy=0.9),
        ("SAC-GLAM+HER", "compiled"): Figures(
            steady=15.0, whole_run=8.0, updates_per_s=3.7, tflops=55.0, busy=0.88, peak_memory_gib=4.94
        ),
        ("PPO-GLAM", "captured"): Figures(steady=60.0, whole_run=61.0, updates_per_s=0.1),
        ("PPO-GLAM", "compiled"): Figures(steady=float("nan"), whole_run=27.0, updates_per_s=float("nan")),
        ("SAC-GLAM+HER (4 ranks on one GPU)", "captured"): Figures(steady=27.0, whole_run=70.0, updates_per_s=1.8),
    }
    command = "python -m sacglam_core.benchmarks.gpu_check"
    write_rates(path, "H100", "NVIDIA H100 80GB HBM3", "bfloat16", runs, command)
    one, four = yaml.safe_load(path.read_text())["measurements"]
    assert one["env_steps_per_s"] == {
        "sac+her": {"steady": 15.0, "whole_run": 8.0, "peak_memory_gib": 4.9},
        "ppo": {"steady": 60.0, "whole_run": 61.0},
    }  # fmt: skip (a peak not measured)
    assert (one["ranks_per_gpu"], four["ranks_per_gpu"]) == (1, 4)
    assert four["env_steps_per_s"] == {"sac+her": {"steady": 27.0, "whole_run": 70.0}}
    assert {k: one[k] for k in ("dtype", "load_in_4bit", "critic", "device_name", "command")} == {
        "dtype": "bfloat16", "load_in_4bit": True, "critic": "obs_action", "device_name": "NVIDIA H100 80GB HBM3",
        "command": command,
    }  # fmt: skip
    assert one["torch"] == torch.__version__ and one["transformers"] == transformers.__version__
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", one["commit"])  # this checkout's
    assert one["date"] == datetime.date.today()
    assert (
        "SAC-GLAM+HER: steady eager 3.80, captured 9.00, compiled 15.00; compiled: 55 TFLOP/s in kernels, GPU busy 88%"
        in (" ".join(one["notes"].split()))
    )
    assert sorted(p.name for p in path.parent.iterdir()) == ["H100.yaml"]  # written under a temporary name, renamed

    main = expand(load_definitions(ROOT / "workflow" / "config" / "experiments.yaml"), ["main"], tmp_path / "results")
    calibration = budgeting.load_calibration(table, tmp_path / "results")
    today = datetime.date.today()
    for gpus, sac in ((4, 15.0), (1, 27.0)):  # the paper's 4 ranks a GPU each, or on one GPU
        priced = {e.run.variant: (e.rate, e.source) for e in budgeting.estimate(main, gpus, "H100", calibration)}
        assert priced["SAC-GLAM+HER"] == (pytest.approx(sac * 3600), f"gpu_check measured {today}")

    # a steady state the run did not reach leaves the whole run's rate; measuring a setting again replaces it
    late = {("SAC-GLAM+HER", "captured"): Figures(steady=float("nan"), whole_run=6.0, updates_per_s=float("nan"))}
    write_rates(path, "H100", "NVIDIA H100 80GB HBM3", "bfloat16", late, command)
    measurements = yaml.safe_load(path.read_text())["measurements"]
    assert [m["ranks_per_gpu"] for m in measurements] == [4, 1]
    assert measurements[1]["env_steps_per_s"] == {"sac+her": {"whole_run": 6.0}}  # no steady rate: none written
    her = next(run for run in main if run.variant == "SAC-GLAM+HER")
    rate, source = budgeting.load_calibration(table, tmp_path / "results").rate(her.config, "H100")
    assert rate == pytest.approx(6.0 * 3600) and source == f"gpu_check measured {today}, whole run"


def test_counting_flops_leaves_compiled_blocks_compiled(tiny_models):
    """The FLOP count of a loop's first call runs under a dispatch mode, which torch.compile cannot trace: that call
    runs the blocks eagerly and every later one runs them compiled (a GPU measured 'compiled' at the eager kernels'
    count while the counter broke the blocks' compilation)."""
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    from sacglam_core.agent import AgentConfig, GlamAgent
    from sacglam_core.benchmarks.gpu_check import Counted
    from sacglam_core.config import ModelConfig
    from sacglam_core.envs import VectorPlayground
    from sacglam_core.envs.playground import ACTION_VOCABULARY

    model = ModelConfig(str(tiny_models["tiny-t5"]), compile=True)
    agent = GlamAgent.from_config(AgentConfig(model), ACTION_VOCABULARY)
    obs, infos = VectorPlayground(4, seed=0).reset()
    batch = agent.batch(infos["goal"], obs, infos["possible_actions"])
    algo = SimpleNamespace(act=lambda: agent.policy(batch)[0].log_probs)
    counted = Counted(SimpleNamespace(algo=algo))
    counters.clear()
    first = algo.act()
    assert counted.flops["act"] > 0 and counters["stats"]["unique_graphs"] == 0
    torch.testing.assert_close(algo.act(), first, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] > 0


def test_the_steady_window_counts_the_graphs_first_met_inside_it():
    """A capture or a compilation inside SAC's steady window (the second half of its updating steps) slows the rate
    it reports: the window says how many kinds of call it met first; those met before it do not count."""
    from sacglam_core.benchmarks.gpu_check import Mark, rates

    marks = [Mark(0, 0, 0.0, 0), Mark(8, 0, 1.0, 1)]  # acting only
    marks += [Mark(8 * k, 2 * (k - 1), float(k), 1 + k) for k in range(2, 6)]  # a new kind at each updating step
    marks += [Mark(48, 10, 6.0, 6), Mark(56, 12, 7.0, 6)]
    steady, whole, updates_per_s, new = rates(marks, "sac")
    # updating marks: steps 16..56 (6 marks); the window starts at the fourth, Mark(40, 8, 5.0, 6)
    assert (steady, whole, updates_per_s, new) == (8.0, 8.0, 2.0, 0)
    marks[-1] = Mark(56, 12, 7.0, 9)
    assert rates(marks, "sac")[3] == 3
    # PPO's window: from its first update to its last (here, the updating marks from step 16 on)
    assert rates(marks, "ppo") == (8.0, 8.0, 2.0, 6)
    assert math.isnan(rates(marks[:3], "ppo")[0])  # one update: no cycle after the first


def test_the_profiled_steps_are_whole_steps_of_the_environments():
    """The profiled window ends at a count of environment steps that the loop reaches: the four ranks' 32
    environments step 32 at a time, so 8 requested steps profile one step of them (before, the window never closed)."""
    from sacglam_core.benchmarks.gpu_check import profiled_steps

    requested = [(8, 8), (16, 8), (8, 32), (33, 32)]  # (steps, environments)
    assert [profiled_steps(steps, envs) for steps, envs in requested] == [8, 16, 32, 64]


def test_other_weights_are_measured_and_recorded_beside_the_4bit_ones(tmp_path):
    """`--weights dense` loads the base weights in the compute dtype, `--weights dequantized` the 4-bit ones
    dequantized once at load; the rates file records each as such, beside (not over) the paper's 4-bit measurement of
    the same setting, and the budget prices each run from its own weights' rate (a dequantized run from 4-bit's where
    it has none; a 4-bit run never from a dequantized one's)."""
    configs = {w: run_config("SAC-GLAM+HER", tmp_path, "cpu", "eager", 8, tmp_path / w, False, weights=w).model for w
               in WEIGHTS}  # fmt: skip
    assert [(c.load_in_4bit, c.dequantize_4bit) for c in configs.values()] == [
        (True, False),
        (True, True),
        (False, False),
    ]
    path = tmp_path / "gpu_rates" / "H200.yaml"
    runs = {("SAC-GLAM+HER", "compiled"): Figures(steady=40.0, whole_run=16.0, updates_per_s=5.0)}
    write_rates(path, "H200", "NVIDIA H200", "bfloat16", runs, "gpu_check")
    fewer = {("SAC-GLAM+HER", "compiled"): Figures(steady=30.0, whole_run=16.0, updates_per_s=5.0)}

    def sac_rate(dequantized: bool) -> float:
        found = gpu_rates.load(path, ["H200"]).find("bfloat16", True, "obs_action", 1, dequantized)
        return found.env_steps_per_s["sac+her"].steady

    assert sac_rate(True) == 40.0  # none of its own yet: 4-bit's
    write_rates(path, "H200", "NVIDIA H200", "bfloat16", fewer, "gpu_check --weights dequantized", "dequantized")
    write_rates(path, "H200", "NVIDIA H200", "bfloat16", runs, "gpu_check --weights dense", "dense")
    recorded = yaml.safe_load(path.read_text())["measurements"]
    assert sorted((m["load_in_4bit"], m.get("dequantize_4bit", False)) for m in recorded) == [
        (False, False), (True, False), (True, True)
    ]  # fmt: skip
    notes = {(m["load_in_4bit"], m.get("dequantize_4bit", False)): " ".join(m["notes"].split()) for m in recorded}
    assert (
        "LoRA, bfloat16 weights" in notes[False, False] and "LoRA, 4-bit weights dequantized once" in notes[True, True]
    )
    assert (sac_rate(False), sac_rate(True)) == (40.0, 30.0)
