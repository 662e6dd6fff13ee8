"""The GPU-hour budget of planned runs: the paper's rate, relative costs, measured runs, what is left of
partially done runs, attempts per run, hours already spent and the allocation guard."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sacglam_core import runfiles
from sacglam_core.jobs import budget as budgeting
from sacglam_core.pipeline.experiments import Run, expand, load_definitions, merge

ROOT = Path(__file__).resolve().parents[1]
DEFINITIONS = ROOT / "workflow" / "config" / "experiments.yaml"

V100 = "Tesla V100-SXM2-32GB"
LIMITS = budgeting.Limits(time_min=1200, signal_delay_s=120, max_requeues=20)


@pytest.fixture(scope="module")
def definitions():
    return load_definitions(DEFINITIONS)


def table(tmp_path, sac: float = 1.0):
    """The calibration table with the paper's rate for every algorithm (SAC's relative cost `sac`)."""
    raw = yaml.safe_load((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    raw["relative_cost"] = {"ppo": 1.0, "ppo+her": 1.0, "sac": sac, "sac+her": 1.0}
    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def make(runs, tmp_path, sac=1.0, results=None, gpus=4):
    calibration = budgeting.load_calibration(table(tmp_path, sac), results or tmp_path)
    return budgeting.make_budget(runs, gpus, "V100", calibration, LIMITS, results or tmp_path)


def by_variant(budget) -> dict[str, list[budgeting.Estimate]]:
    out = {}
    for e in budget.estimates:
        out.setdefault(e.run.variant, []).append(e)
    return out


def finish(run: Run, hours: float, gpus: int = 4, gpu_name: str = V100) -> None:
    run.directory.mkdir(parents=True, exist_ok=True)
    (run.directory / "config.yaml").write_text(yaml.safe_dump(run.settings))
    summary = {"env_steps": run.config.total_steps, "wall_seconds": hours * 3600, "gpus": gpus, "gpu_name": gpu_name}
    (run.directory / "done.json").write_text(json.dumps(summary))


def checkpoint(run: Run, steps: int, world: int = 4) -> None:
    (run.directory / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run.directory / "config.yaml").write_text(yaml.safe_dump(run.settings))
    manifest = {"number": steps, "world": world, "files": {}}
    (run.directory / "checkpoints" / f"ckpt-{steps:09d}.json").write_text(json.dumps(manifest))


def test_the_papers_rate_and_scaled_estimates_are_labelled(tmp_path, definitions):
    runs = expand(definitions, ["main", "critic_architecture"], tmp_path)
    budget = make(runs, tmp_path)
    main = [e for e in budget.estimates if e.run.experiment == "main"]
    assert {e.source for e in main} == {"paper"} and sum(e.gpu_hours for e in main) == pytest.approx(12 * 80)
    ablation = [e for e in budget.estimates if e.run.experiment == "critic_architecture"]
    # 100,000 steps on the simplified environment: the paper's rate scaled, and said so
    assert {e.source for e in ablation} == {"scaled estimate"} and ablation[0].gpu_hours == pytest.approx(20)


def test_sac_costs_more_per_step_than_ppo(tmp_path, definitions):
    budget = make(expand(definitions, ["main"], tmp_path), tmp_path, sac=1.5)
    variants = by_variant(budget)
    assert variants["PPO-GLAM"][0].gpu_hours == pytest.approx(80) and variants["PPO-GLAM"][0].source == "paper"
    assert variants["SAC-GLAM"][0].gpu_hours == pytest.approx(120)
    assert variants["SAC-GLAM"][0].source == "paper, sac x1.5"


def test_the_committed_rates_make_sac_slower_than_ppo(tmp_path, definitions):
    """The paper's 80 GPU-hours per seed for SAC-GLAM; PPO-GLAM, faster per step (Section 3), costs less."""
    calibration = budgeting.load_calibration(ROOT / "workflow" / "config" / "calibration.yaml", tmp_path)
    estimates = budgeting.estimate(expand(definitions, ["main"], tmp_path), 4, "V100", calibration)
    seed = {e.run.variant: (e.gpu_hours, e.source) for e in estimates}
    assert seed["SAC-GLAM"] == seed["SAC-GLAM+HER"] == (pytest.approx(80), "paper")
    assert seed["PPO-GLAM"] == (pytest.approx(80 * 0.43), "paper, ppo x0.43")


def test_partial_finished_and_measured_runs(tmp_path, definitions):
    runs = expand(definitions, ["main"], tmp_path)
    sac = [r for r in runs if r.variant == "SAC-GLAM"]
    finish(sac[0], hours=10)  # 400,000 steps in 10 h on 4 GPUs: 10,000 steps per GPU-hour, measured
    checkpoint(sac[1], steps=100_000)
    budget = make(runs, tmp_path)
    states = {e.run.directory: e for e in budget.estimates}
    assert states[sac[0].directory].status == "finished" and states[sac[0].directory].gpu_hours == 0
    resumed = states[sac[1].directory]
    assert resumed.status == "resumes" and resumed.remaining_steps == 300_000
    assert resumed.source == "measured (1 runs)" and resumed.gpu_hours == pytest.approx(30)
    assert states[sac[2].directory].gpu_hours == pytest.approx(40)
    # already spent: the finished run as measured, the checkpointed quarter of the other at the measured rate
    assert budget.spent_finished == pytest.approx(40) and budget.spent_partial == pytest.approx(10)


def test_a_run_checkpointed_on_cpus_spends_no_gpu_hours(tmp_path, definitions):
    """The local profile writes to the same results folder: its unfinished runs cost no GPU-hour."""
    runs = expand(definitions, ["main"], tmp_path)
    checkpoint(runs[0], steps=100_000, world=1)
    line = {"env_steps": 100_000, "steps_per_s": 30.0, "eta_s": 60.0, "wall_seconds": 3000.0, "gpus": 0, "time": 1.0}
    (runs[0].directory / "progress.json").write_text(json.dumps(line))
    checkpoint(runs[1], steps=100_000, world=4)
    (runs[1].directory / "progress.json").write_text(json.dumps(line | {"gpus": 4}))
    assert make(runs, tmp_path).spent_partial == pytest.approx(20)  # runs[1]'s quarter of 80 GPU-h
    (runs[1].directory / "progress.json").write_text("{")  # damaged: its checkpoint still counts
    assert make(runs, tmp_path).spent_partial == pytest.approx(20)


@pytest.mark.parametrize(
    "damage", [{"wall_seconds": "x"}, {"gpus": "four"}, {"env_steps": None}, {"wall_seconds": -1.0}, "[3600]", "{"]
)
def test_a_damaged_finished_run_measures_nothing_and_is_still_finished(tmp_path, definitions, damage):
    """A damaged done.json beside a good one: the budget measures the good one only; the damaged run is finished (a
    mapping: the driver writes its marker only) or refuses the launch (not a mapping)."""
    runs = expand(definitions, ["main"], tmp_path)
    sac = [r for r in runs if r.variant == "SAC-GLAM"]
    finish(sac[0], hours=10)
    finish(sac[1], hours=5)
    done = sac[1].directory / "done.json"
    summary = json.loads(done.read_text())
    done.write_text(damage if isinstance(damage, str) else json.dumps({**summary, **damage}))
    if isinstance(damage, dict):
        budget = make(sac, tmp_path)
        states = {e.run.directory: e for e in budget.estimates}
        assert states[sac[1].directory].status == "finished" and states[sac[1].directory].gpu_hours == 0
        assert states[sac[2].directory].source == "measured (1 runs)"
        assert budget.spent_finished == pytest.approx(40)
    else:
        with pytest.raises(runfiles.RunStateError, match=f"{re.escape(str(done))} (exists but|does not hold)"):
            make(sac, tmp_path)
        assert make(sac[2:], tmp_path).spent_finished == pytest.approx(40)


def test_attempts_per_run_follow_the_time_limit(tmp_path, definitions):
    budget = make(expand(definitions, ["main"], tmp_path), tmp_path)
    assert LIMITS.hours_per_attempt == pytest.approx(20 - 2 / 60)
    assert LIMITS.attempts(20.0) == 2 and LIMITS.attempts(19.9) == 1 and LIMITS.attempts(math.nan) == 1
    report = budgeting.report(budget, None)
    assert "PPO-GLAM                                    4  new          4    20.0        2      320.0  paper" in report
    tight = budgeting.Budget(budget.estimates, 0, 0, budgeting.Limits(1200, 120, 0), budget.calibration)
    assert "needs 2 attempts but launcher.max_requeues=0 allows 1" in budgeting.report(tight, None)


def test_report_subtotals_spent_and_the_total_at_the_end(tmp_path, definitions):
    runs = expand(definitions, ["main", "critic_architecture"], tmp_path)
    finish(runs[0], hours=20)  # 80 GPU-h spent, outside the plan
    planned = runs[1:]
    budget = make(planned, tmp_path)
    report = budgeting.report(budget, 1000).splitlines()
    assert report[0] == "GPU-hour budget of Snakemake's plan: 19 train jobs (19 new)"
    assert any(line.startswith("    subtotal main") and line.endswith("880.0") for line in report)
    assert any(line.startswith("    subtotal critic_architecture") and line.endswith("160.0") for line in report)
    assert "80.0 GPU-h by finished runs (measured)" in "\n".join(report)
    assert report[-2] == (
        "  total: 19 runs to train, 1,040.0 GPU-hours planned + 80.0 spent = 1,120.0 of the allocation's 1,000.0 "
        "(budget.allocation_gpu_hours)"
    )
    assert report[-1].startswith("  WARNING: 1,120.0 GPU-hours is over the allocation of 1,000.0")
    with pytest.raises(budgeting.BudgetExceededError, match="1,040.0 GPU-hours and 80.0 are already spent"):
        budgeting.check_allocation(budget, 1000)
    budgeting.check_allocation(budget, 1200)


def test_cpu_runs_are_budgeted_from_measured_cpu_runs(tmp_path, definitions):
    runs = expand(definitions, ["smoke"], tmp_path, {"models": "resources/models"})
    (estimate, *_) = make(runs[:1], tmp_path, gpus=0).estimates
    assert math.isnan(estimate.wall_hours) and estimate.source == "not measured yet" and estimate.gpu_hours == 0
    done = runs[0]
    done.directory.mkdir(parents=True)
    (done.directory / "config.yaml").write_text(yaml.safe_dump(done.settings))
    (done.directory / "done.json").write_text(json.dumps({"env_steps": 1024, "wall_seconds": 360, "gpus": 0}))
    twin = Run(done.experiment, done.variant, 1, tmp_path / "other", {**done.settings, "seed": 1})
    (estimate,) = make([twin], tmp_path, gpus=0).estimates
    assert estimate.source == "measured (1 runs)" and estimate.wall_hours == pytest.approx(0.1)  # 1024 steps, 6 min


def test_an_exhausted_allocation_never_refuses_a_plan_without_training(tmp_path, definitions):
    runs = expand(definitions, ["main"], tmp_path)
    finish(runs[0], hours=20)  # 80 GPU-h spent, all of the allocation
    budget = make([runs[0]], tmp_path)  # planned: only its marker (as for `figures`, which plans no train at all)
    assert budget.planned == 0 and not budget.over(50)
    budgeting.check_allocation(budget, 50)
    assert "WARNING" not in budgeting.report(budget, 50)


def test_other_gpus_are_budgeted_by_the_peak_ratio_rule_until_measured(tmp_path, definitions):
    table = tmp_path / "calibration.yaml"  # without the committed gpu_check files
    table.write_text((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    calibration = budgeting.load_calibration(table, tmp_path)
    runs = expand(definitions, ["main"], tmp_path)
    hours, sources = {}, {}
    for gpu in ("V100", "A100"):
        estimates = budgeting.estimate(runs, 8, gpu, calibration)
        hours[gpu], sources[gpu] = sum(e.gpu_hours for e in estimates), {e.source for e in estimates}
    assert hours["V100"] == pytest.approx(777.6) and sources["V100"] == {"paper", "paper, ppo x0.43"}
    # Flan-T5 with LoRA computes in float16 on a V100 (the paper's 125 TFLOP/s), in bfloat16 on an A100
    assert sources["A100"] == {"peak-ratio rule x2.50 (A100 bfloat16), not measured"}
    assert hours["A100"] == pytest.approx(777.6 * 125 / 312)
    report = budgeting.report(budgeting.make_budget(runs, 4, "A100", calibration, LIMITS, tmp_path), None)
    assert "the paper's implementation scaled by peaks, not this code" in report
    sac = [r for r in runs if r.variant == "SAC-GLAM"]
    finish(sac[0], hours=5, gpu_name="NVIDIA A100-SXM4-80GB")  # 400,000 steps in 20 GPU-hours, measured
    measured = budgeting.estimate(sac[1:], 4, "A100", budgeting.load_calibration(table, tmp_path))
    assert {(e.source, round(e.gpu_hours, 6)) for e in measured} == {("measured (1 runs)", 20.0)}
    with pytest.raises(ValueError, match=r"budget.gpu: B200 is not a GPU of the calibration table \(V100, A100"):
        budgeting.make_budget(sac, 4, "B200", calibration, LIMITS, tmp_path)


def test_the_committed_gpu_check_files_price_h100_and_h200_runs(tmp_path, definitions):
    """H200: gpu_check's steady rates, compiled (PPO's captured), 4-bit weights, one rank per GPU and the paper's 4
    ranks on one GPU; H100, not measured with this code: H200's by the ratio of their dense bfloat16 peaks (the
    same)."""
    calibration = budgeting.load_calibration(ROOT / "workflow" / "config" / "calibration.yaml", tmp_path)
    runs = expand(definitions, ["main"], tmp_path)
    h200 = {e.run.variant: e for e in budgeting.estimate(runs, 4, "H200", calibration)}
    assert h200["SAC-GLAM+HER"].source == "gpu_check measured 2026-11-28"
    assert h200["SAC-GLAM+HER"].gpu_hours == pytest.approx(400_000 / (43.2 * 3600))  # a process's steps/s x 3,600
    assert h200["PPO-GLAM"].rate == pytest.approx(64.2 * 3600)
    assert h200["SAC-GLAM"].source == "gpu_check measured 2026-11-28, from sac+her x1.00"
    one = {e.run.variant: e for e in budgeting.estimate(runs, 1, "H200", calibration)}  # the 4 ranks on one GPU
    assert one["SAC-GLAM+HER"].gpu_hours == pytest.approx(400_000 / (56.98 * 3600)) and one["SAC-GLAM+HER"].gpus == 1
    assert one["PPO-GLAM"].source == "gpu_check measured 2026-11-28, one rank per GPU's for 4"
    assert one["PPO-GLAM"].gpu_hours == pytest.approx(h200["PPO-GLAM"].gpu_hours)  # no gain assumed
    h100 = {e.run.variant: e for e in budgeting.estimate(runs, 1, "H100", calibration)}
    assert h100["SAC-GLAM+HER"].source == "gpu_check measured 2026-11-28, on H200 x1.00 (dense peaks)"
    assert h100["SAC-GLAM+HER"].gpu_hours == pytest.approx(one["SAC-GLAM+HER"].gpu_hours)
    assert h100["SAC-GLAM+HER"].gpu_hours < 5
    her = next(r for r in runs if r.variant == "SAC-GLAM+HER")
    bf16_weights = replace(her, settings=merge(her.settings, {"model": {"load_in_4bit": False}}))
    assert calibration.rate(bf16_weights.config, "H200")[1].startswith(budgeting.PEAK_RATIO)  # not measured
    report = budgeting.report(budgeting.make_budget(runs, 4, "H200", calibration, LIMITS, tmp_path), None)
    assert "gpu_check measured <date>: one process's environment steps/s on a GPU" in report
    assert "peak-ratio" not in report


def test_both_layouts_are_priced_from_the_measured_rates_and_the_cheaper_that_fits_is_named(tmp_path, definitions):
    """The paper's runs (4 ranks each) a GPU per rank and all on one GPU, on H200s: each priced from gpu_check's
    rates of that many ranks per GPU, each process's measured peak against the GPU's memory."""
    calibration = budgeting.load_calibration(ROOT / "workflow" / "config" / "calibration.yaml", tmp_path)
    runs = [r for r in expand(definitions, ["main"], tmp_path) if r.variant == "SAC-GLAM+HER"]
    apart, together = budgeting.price_layouts(runs, "H200", calibration)
    assert (apart.gpus_per_node, apart.name, together.gpus_per_node, together.name) == (
        4, "a GPU per rank", 1, "4 ranks on one GPU"
    )  # fmt: skip
    assert apart.gpu_hours == pytest.approx(len(runs) * 400_000 / (43.2 * 3600))
    assert together.gpu_hours == pytest.approx(len(runs) * 400_000 / (56.98 * 3600))
    assert (apart.peak_gib, together.peak_gib, together.memory_gib) == (4.6, 17.1, 139)
    assert budgeting.cheapest([apart, together]) is together
    budget = budgeting.make_budget(runs, 4, "H200", calibration, LIMITS, tmp_path)
    lines = "\n".join(budgeting.layout_lines(budget))
    assert re.search(
        r"gpus_per_node: 4 \(a GPU per rank\) +10\.3 GPU-h, 0\.6 h a run, 4\.6 GiB a process: fits  <- this plan", lines
    )
    assert "cheaper that fits: gpus_per_node: 1 (4 ranks on one GPU), not this plan's" in lines


def test_a_layout_over_the_gpus_memory_is_not_chosen_and_a_plan_in_it_is_warned_about(tmp_path, definitions):
    raw = yaml.safe_load((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    raw["gpus"]["H200"]["memory_gib"] = 16  # under the 4 ranks' 17.1 GiB
    (tmp_path / "calibration.yaml").write_text(yaml.safe_dump(raw))
    rates = (ROOT / "workflow" / "config" / "gpu_rates" / "H200.yaml").read_text()
    (tmp_path / "gpu_rates").mkdir()
    (tmp_path / "gpu_rates" / "H200.yaml").write_text(rates)
    calibration = budgeting.load_calibration(tmp_path / "calibration.yaml", tmp_path)
    runs = [r for r in expand(definitions, ["main"], tmp_path / "results") if r.variant == "SAC-GLAM+HER"]
    budget = budgeting.make_budget(runs, 1, "H200", calibration, LIMITS, tmp_path)
    apart, together = budget.layouts
    assert (apart.fits, together.fits) == (True, False) and budgeting.cheapest(budget.layouts) is apart
    lines = "\n".join(budgeting.layout_lines(budget))
    assert "17.1 GiB a process: does NOT fit  <- this plan" in lines
    assert "WARNING: a process of this plan's layout peaks at 17.1 GiB, over the GPU's 16 GiB" in lines


def test_without_a_measured_peak_the_fit_is_unknown_and_nothing_is_named(tmp_path, definitions):
    rates_file(tmp_path, gpu="H100", ranks_per_gpu=4)  # a 4-rank rate without a peak
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path)
    runs = [r for r in expand(definitions, ["main"], tmp_path / "results") if r.variant == "SAC-GLAM+HER"]
    budget = budgeting.make_budget(runs, 4, "H100", calibration, LIMITS, tmp_path)
    assert [layout.fits for layout in budget.layouts] == [None, None] and budgeting.cheapest(budget.layouts) is None
    assert "cheaper that fits: unknown" in "\n".join(budgeting.layout_lines(budget))
    v100 = budgeting.make_budget(runs, 4, "V100", calibration, LIMITS, tmp_path)  # priced by the peak ratio alone
    assert v100.layouts[0].gpu_hours == pytest.approx(v100.layouts[1].gpu_hours)


def rates_file(folder: Path, gpu: str = "H100", **measurement) -> Path:
    """A gpu_check file of `gpu` with one measurement (bfloat16, 4-bit, the paper's critic), `measurement` over it."""
    entry = {"dtype": "bfloat16", "load_in_4bit": True, "critic": "obs_action",
             "env_steps_per_s": {"sac+her": {"steady": 4.0, "whole_run": 5.5}}, "device_name": f"NVIDIA {gpu}",
             "date": "2026-12-01", "command": "python -m sacglam_core.benchmarks.gpu_check"}  # fmt: skip
    path = folder / "gpu_rates" / f"{gpu}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"gpu": gpu, "measurements": [{**entry, **measurement}]}, sort_keys=False))
    return path


def test_a_gpu_check_file_prices_its_gpu_type_and_finished_runs_still_win(tmp_path, definitions):
    rates_file(tmp_path)  # beside table(tmp_path)'s calibration table
    runs = expand(definitions, ["main", "critic_architecture"], tmp_path / "results")
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path)
    seeds = by_variant(budgeting.make_budget(runs, 4, "H100", calibration, LIMITS, tmp_path))
    her = seeds["SAC-GLAM+HER"][0]
    assert her.source == "gpu_check measured 2026-12-01" and her.gpu_hours == pytest.approx(400_000 / (4.0 * 3600))
    # 100,000 steps of SAC-GLAM on the simplified environment, scaled as the paper's rate is: per step
    ablation = seeds["input=obs weights=shared"][0]
    assert ablation.source == "gpu_check measured 2026-12-01, from sac+her x1.00"
    assert ablation.gpu_hours == pytest.approx(100_000 / (4.0 * 3600))
    sac = seeds["SAC-GLAM"]
    finish(sac[0].run, hours=5, gpu_name="NVIDIA H100 80GB HBM3")  # 400,000 steps in 20 GPU-hours
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path / "results")
    measured = budgeting.estimate([e.run for e in sac[1:]], 4, "H100", calibration)
    assert {(e.source, round(e.gpu_hours, 6)) for e in measured} == {("measured (1 runs)", 20.0)}
    # a whole-run rate only is used, and said so; a float32 run finds no measurement and falls back to the rule
    rates_file(tmp_path, env_steps_per_s={"sac+her": {"whole_run": 5.5}})
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path)
    rate, source = calibration.rate(her.run.config, "H100")
    assert rate == pytest.approx(5.5 * 3600) and source == "gpu_check measured 2026-12-01, whole run"
    fp32 = replace(her.run, settings=merge(her.run.settings, {"model": {"dtype": "float32", "load_in_4bit": False}}))
    assert calibration.rate(fp32.config, "H100")[1] == "peak-ratio rule x0.54 (H100 float32), not measured"


def test_dequantized_weights_are_priced_apart_and_never_price_the_papers_runs(tmp_path, definitions):
    """`model.dequantize_4bit`: priced from 4-bit's gpu_check rate until its own is measured (said so), its memory
    never from 4-bit's (it holds more), and neither its measured rate nor its finished runs price a 4-bit run."""
    her = next(r for r in expand(definitions, ["main"], tmp_path / "results") if r.variant == "SAC-GLAM+HER")
    once = replace(her, settings=merge(her.settings, {"model": {"dequantize_4bit": True}}))
    assert budgeting.calibration_key(once.config, "H100") != budgeting.calibration_key(her.config, "H100")
    speeds = {"sac+her": {"steady": 4.0, "peak_memory_gib": 9.0}}
    rates_file(tmp_path, env_steps_per_s=speeds)
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path)
    assert calibration.rate(once.config, "H100") == (4.0 * 3600, "gpu_check measured 2026-12-01, from 4-bit weights")
    assert calibration.peak_memory(once.config, "H100", 1) is None and calibration.peak_memory(her.config, "H100", 1)
    rates_file(tmp_path, dequantize_4bit=True, env_steps_per_s={"sac+her": {"steady": 5.0, "peak_memory_gib": 9.5}})
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path)
    assert calibration.rate(once.config, "H100") == (5.0 * 3600, "gpu_check measured 2026-12-01")
    assert calibration.peak_memory(once.config, "H100", 1) == (9.5, "H100")
    assert calibration.rate(her.config, "H100")[1].startswith(budgeting.PEAK_RATIO)  # the dequantized one is not its
    finish(once, hours=1, gpu_name="NVIDIA H100 80GB HBM3")  # a fast finished run of its own key
    calibration = budgeting.load_calibration(table(tmp_path), tmp_path / "results")
    assert calibration.rate(once.config, "H100")[1] == "measured (1 runs)"
    assert calibration.rate(her.config, "H100")[1].startswith(budgeting.PEAK_RATIO)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"gpu": "L40S"},
            "{folder}/L40S.yaml: gpu: L40S is not a GPU of the calibration table (",
        ),
        ({"gpu": "H200"}, "{folder}/H100.yaml: gpu: H200 is measured in H200.yaml, one file per GPU type"),
        (
            {"env_steps_per_s": {"sac+her": {"steady": -1}}},
            "{folder}/H100.yaml: measurements.0.env_steps_per_s.sac+her.steady: Input should be greater than 0 "
            "(got -1)",
        ),
        (
            {"env_steps_per_s": {"sac+per": {"steady": 4.0}}},
            "{folder}/H100.yaml: measurements.0.env_steps_per_s.sac+per: Input should be 'sac', 'sac+her', 'ppo' or "
            "'ppo+her' (got 'sac+per')",
        ),
        (
            {"env_steps_per_s": {"ppo": {}}},
            "{folder}/H100.yaml: measurements.0.env_steps_per_s.ppo: give steady, whole_run or both",
        ),
        ({"date": None}, "{folder}/H100.yaml: measurements.0.date: Input should be a valid date (got None)"),
        ({"load_in_4bit": 4}, "{folder}/H100.yaml: measurements.0.load_in_4bit: Input should be a valid boolean"),
        (
            {"env_steps_per_s": {"ppo": {"steady": 4.0, "peak_memory_gib": 0}}},
            "{folder}/H100.yaml: measurements.0.env_steps_per_s.ppo.peak_memory_gib: Input should be greater than 0",
        ),
        (
            {"load_in_4bit": False, "dequantize_4bit": True},
            "{folder}/H100.yaml: measurements.0: dequantize_4bit needs load_in_4bit: it dequantizes the 4-bit weights",
        ),
        ("gpu: H100\nmeasurements: [\n", "GPU rates file {folder}/H100.yaml is not valid YAML"),
    ],
    ids=[
        "unknown GPU",
        "misnamed",
        "negative",
        "unknown algorithm",
        "no rate",
        "no date",
        "not a boolean",
        "no memory",
        "dequantized, not 4-bit",
        "not YAML",
    ],  # fmt: skip
)
def test_a_bad_gpu_check_file_is_one_line_naming_the_file_and_key(tmp_path, change, message):
    if isinstance(change, str):
        rates_file(tmp_path).write_text(change)
    elif "gpu" in change:
        path = rates_file(tmp_path)
        path.write_text(path.read_text().replace("gpu: H100", f"gpu: {change['gpu']}"))
        if change["gpu"] == "L40S":
            path.rename(path.with_name("L40S.yaml"))
    else:
        rates_file(tmp_path, **change)
    with pytest.raises(ValueError) as error:
        budgeting.load_calibration(table(tmp_path), tmp_path)
    text = str(error.value)
    assert "\n" not in text and text.startswith(message.format(folder=tmp_path / "gpu_rates")), text


def test_a_partition_whose_gpu_types_compute_in_different_dtypes_is_warned_about(tmp_path, definitions):
    from sacglam_core.jobs.plan import mixed_dtypes

    calibration = budgeting.load_calibration(ROOT / "workflow" / "config" / "calibration.yaml", tmp_path)
    (run, *_) = expand(definitions, ["main"], tmp_path)  # Flan-T5 with LoRA, dtype auto

    def warn(types):
        return mixed_dtypes(types, run, calibration, "gpu", "cluster.yaml")

    (warning,) = warn(["a100", "tesla_v100"])
    assert warning.startswith("partition gpu mixes GPU types with dtype: auto computing differently on them, a100 ")
    assert "a100 (bfloat16), tesla_v100 (float16)" in warning and warning.endswith("(cluster.yaml)")
    assert warn(["a100_80g", "H100"]) == [] and warn(["a100"]) == []  # bfloat16 on both; one type
    assert "mystery (unknown)" in warn(["a100", "mystery"])[0]


def test_variant_and_experiment_names_are_shown_whole(tmp_path, definitions):
    """A grid's variant names (`input=obs_action weights=shared_frozen`) are never cut to a width: two would share a
    row. An experiment's name, in the summary, likewise."""
    runs = expand(definitions, ["critic_architecture"], tmp_path)
    budget = make(runs, tmp_path)
    report = budgeting.report(budget, None)
    for variant in {run.variant for run in runs}:
        assert re.search(rf"^    {re.escape(variant)} +\d+  new", report, re.M), variant
    long = replace(runs[0], experiment="an_experiment_whose_name_is_longer_than_forty_characters")
    summary = budgeting.summary(make([long], tmp_path), None, {long.experiment: 0})
    assert re.search(rf"^  {long.experiment} +1 +0 ", summary, re.M), summary


def test_a_cpu_plans_budget_explains_cpu_runs_and_nothing_of_slurm_or_the_papers_gpus(tmp_path, definitions):
    """The local profile's dry run: no SLURM attempts, no V100 figure of the paper, which do not apply to it."""
    runs = expand(definitions, ["smoke"], tmp_path, {"models": "resources/models"})
    report = budgeting.report(make(runs, tmp_path, gpus=0), None)
    assert "  on a CPU: the hours a run takes, from finished runs of the same key" in report
    assert "attempts: SLURM jobs" not in report and "paper: Appendix C" not in report
    gpu = budgeting.report(make(expand(definitions, ["main"], tmp_path), tmp_path), None)
    assert "attempts: SLURM jobs" in gpu and "paper: Appendix C" in gpu and "on a CPU" not in gpu
