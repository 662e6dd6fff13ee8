"""The workflow: experiments expanded into runs, the GPU-hour budget, dry runs and the local profile."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sacglam_core.pipeline.budget import BudgetExceededError, check_allocation, load_calibration, plan, total
from sacglam_core.pipeline.config import parse_workflow_config
from sacglam_core.pipeline.experiments import ExperimentError, Run, expand, load_definitions
from sacglam_core.pipeline.outputs import expected_outputs

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [str(Path(sys.executable).parent / "snakemake")]
DEFINITIONS = ROOT / "workflow" / "config" / "experiments.yaml"
PAPER = ["main", "critic_architecture", "update_frequency", "her_sampling", "nstep_buffer", "ppo_her"]


@pytest.fixture(scope="module")
def definitions():
    return load_definitions(DEFINITIONS)


def test_every_experiment_expands_into_valid_runs(definitions):
    runs = expand(definitions, list(definitions["experiments"]), "results", {"models": "resources/models"})
    by_experiment = {}
    for run in runs:
        by_experiment.setdefault(run.experiment, []).append(run)
        assert run.config.seed == run.seed  # validated as a run configuration
    assert len(by_experiment["main"]) == 3 * 4  # PPO, SAC, SAC+HER x 4 seeds
    assert {r.variant for r in by_experiment["critic_architecture"]} == {
        "input=obs_action weights=shared",
        "input=obs_action weights=shared_frozen",
        "input=obs weights=shared",
        "input=obs weights=shared_frozen",
    }
    assert all(r.config.env.simplified for r in by_experiment["critic_architecture"])
    main = {r.variant: r.config for r in by_experiment["main"]}
    assert main["SAC-GLAM+HER"].her.enabled and main["SAC-GLAM+HER"].sac.alpha_init == 0.05
    assert main["PPO-GLAM"].model.name_or_path == "google/flan-t5-base" and main["PPO-GLAM"].total_steps == 400_000
    assert len({r.directory for r in runs}) == len(runs)


def test_run_directories_are_named_from_the_settings(definitions):
    (before,) = [r for r in expand(definitions, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert before.directory.parent.name.startswith("SAC-GLAM-") and before.directory.name == "seed0"
    changed = yaml.safe_load(DEFINITIONS.read_text())
    changed["experiments"]["main"]["variants"]["SAC-GLAM"]["sac"] = {"n_step": 5}
    (after,) = [r for r in expand(changed, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert after.directory != before.directory  # a changed variant never reuses finished runs
    again = [r for r in expand(definitions, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert again[0].directory == before.directory  # stable across invocations


def test_adding_a_seed_or_an_experiment_is_configuration(definitions):
    extended = yaml.safe_load(DEFINITIONS.read_text())
    extended["experiments"]["main"]["seeds"].append(7)
    extended["experiments"]["gamma"] = {
        "seeds": [0],
        "settings": {"algorithm": "sac"},
        "grid": {"sac.gamma": [0.9, 0.99]},
    }
    runs = expand(extended, ["main", "gamma"], "results")
    assert sum(r.experiment == "main" for r in runs) == 15
    assert sorted(r.config.sac.gamma for r in runs if r.experiment == "gamma") == [0.9, 0.99]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: None, "unknown experiment(s) ['figure12']"),
        (lambda d: d["experiments"]["main"].update(seed=[1]), "unknown keys ['seed']"),
        (lambda d: d["experiments"]["main"]["variants"]["SAC-GLAM"].update(sac={"n_steps": 2}), "sac.n_steps"),
        (lambda d: d["experiments"]["main"].pop("variants"), "defines no variants"),
    ],
)
def test_bad_experiment_definitions_are_rejected(change, message):
    definitions = yaml.safe_load(DEFINITIONS.read_text())
    change(definitions)
    names = ["figure12"] if "figure12" in message else ["main"]
    with pytest.raises(ExperimentError, match=re.escape(message)):
        expand(definitions, names, "results")


def test_budget_from_the_paper_and_from_measured_runs(tmp_path, definitions):
    table = ROOT / "workflow" / "config" / "calibration.yaml"
    runs = expand(definitions, ["main"], tmp_path)
    lines = plan(runs, 4, "Tesla V100-SXM2-32GB", load_calibration(table, tmp_path))
    assert total(lines) == pytest.approx(12 * 80)  # 80 GPU-hours per seed on V100 (paper, Appendix C)
    # One finished SAC run that took 10 hours on 4 GPUs: it is skipped and calibrates the other SAC runs.
    done = [r for r in runs if r.variant == "SAC-GLAM"][0]
    done.directory.mkdir(parents=True)
    (done.directory / "config.yaml").write_text(yaml.safe_dump(done.settings))
    summary = {"env_steps": 400_000, "wall_seconds": 36_000, "gpus": 4, "gpu_name": "Tesla V100-SXM2-32GB"}
    (done.directory / "done.json").write_text(json.dumps(summary))
    lines = {line.variant: line for line in plan(runs, 4, "Tesla V100-SXM2-32GB", load_calibration(table, tmp_path))}
    assert lines["SAC-GLAM"].runs == 3 and lines["SAC-GLAM"].source == "measured"
    assert lines["SAC-GLAM"].gpu_hours == pytest.approx(3 * 40)
    assert lines["SAC-GLAM+HER"].source == "paper" and lines["SAC-GLAM+HER"].gpu_hours == pytest.approx(4 * 80)
    with pytest.raises(BudgetExceededError, match="needs 760.0 GPU-hours but the allocation limit is 500.0"):
        check_allocation(list(lines.values()), 500)
    check_allocation(list(lines.values()), 1000)


def test_workflow_configuration_is_validated():
    raw = yaml.safe_load((ROOT / "workflow" / "config" / "config.yaml").read_text())
    raw["budget"]["allocation_gpu_hours"] = "250"  # what `--config budget={...}` passes
    raw["launcher"]["container"] = "null"
    parsed = parse_workflow_config(raw)
    assert parsed.budget.allocation_gpu_hours == 250.0 and parsed.launcher.container is None
    raw["launcher"]["gpus"] = 4
    with pytest.raises(ValueError, match="launcher.gpus: Unexpected keyword argument"):
        parse_workflow_config(raw)


def snakemake(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--nolock", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_dry_run_of_the_paper_grid_lists_every_run_and_the_budget(tmp_path):
    result = snakemake(
        "--profile", "profiles/slurm", "-n", "--config", f"experiments={json.dumps(PAPER)}", f"results={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = expand(load_definitions(DEFINITIONS), PAPER, tmp_path)
    out = result.stdout + result.stderr
    assert f"total: {len(runs)} runs" in out and "GPU-hour budget" in out
    assert out.count("rule train:") == len(runs)
    assert all(str(run.directory / "done.json") in out for run in runs)
    assert "rule container:" in out  # the image is built (on the login node) before jobs use it
    assert all(f"rule aggregate_{name}:" in out for name in PAPER) and "rule goal_types:" in out


def test_real_launch_refuses_a_plan_above_the_allocation(tmp_path):
    config = ["experiments=[main]", "budget={allocation_gpu_hours: 100}", f"results={tmp_path}"]
    result = snakemake("--profile", "profiles/slurm", "--config", *config)
    assert result.returncode != 0
    assert "the plan needs 960.0 GPU-hours but the allocation limit is 100.0" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing was launched or written


def test_local_profile_runs_the_smoke_experiment_end_to_end(tmp_path):
    results = tmp_path / "results"
    paths = [
        "experiments=[smoke]",
        f"results={results}",
        f"models={tmp_path / 'models'}",
        f"hf_cache={tmp_path / 'hf'}",
    ]
    result = snakemake("--profile", "profiles/local", "--config", *paths)
    assert result.returncode == 0, result.stderr[-3000:]
    definitions = load_definitions(DEFINITIONS)
    runs = expand(definitions, ["smoke"], results, {"models": str(tmp_path / "models")})
    for run in runs:
        done = json.loads((run.directory / "done.json").read_text())
        assert done["env_steps"] == run.config.total_steps
        assert (run.directory / "metrics.csv").read_text().count("\n") == 1 + run.config.total_steps // 256 + 1
        attempts = [json.loads(line) for line in (run.directory / "attempts.jsonl").read_text().splitlines()]
        assert attempts[-1]["exit_status"] == 0
    # The experiment's figures and tables, Figure 4 and the calibration.
    outputs = expected_outputs("smoke", definitions["experiments"]["smoke"], results)
    assert all(p.stat().st_size > 0 for p in outputs)
    assert (results / "figure4.png").exists() and (results / "calibration.yaml").exists()
    summary = (results / "smoke" / "summary.md").read_text()
    assert all(variant in summary for variant in ("PPO-GLAM", "SAC-GLAM", "SAC-GLAM+HER"))

    again = snakemake("--profile", "profiles/local", "--config", *paths)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # A lost run is launched again, alone (its last checkpoint makes that immediate), and its experiment's
    # figures and tables are made again.
    lost = runs[0].directory
    (lost / "done.json").unlink()
    third = snakemake("--profile", "profiles/local", "--config", *paths)
    log = third.stdout + third.stderr
    assert third.returncode == 0, third.stderr[-3000:]
    assert log.count("rule train:") == 1 and "rule aggregate_smoke:" in log
    assert (lost / "done.json").exists()

    # Figures again from existing metrics, without training; then the HTML report.
    figure = results / "smoke" / "figure2.png"
    figure.unlink()
    regenerated = snakemake("--profile", "profiles/local", "--config", *paths, "--", "figures")
    assert regenerated.returncode == 0, regenerated.stderr[-3000:]
    assert figure.exists() and "rule train:" not in regenerated.stdout + regenerated.stderr
    report = tmp_path / "report.html"
    made = snakemake("--profile", "profiles/local", "--config", *paths, "--report", str(report))
    assert made.returncode == 0, made.stderr[-3000:]
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html>") and "figure2.png" in html and "summary.csv" in html


def test_cpu_runs_are_budgeted_from_measured_cpu_runs(tmp_path, definitions):
    table = ROOT / "workflow" / "config" / "calibration.yaml"
    runs = expand(definitions, ["smoke"], tmp_path, {"models": "resources/models"})
    (line, *_) = plan(runs[:1], 0, "ignored", load_calibration(table, tmp_path))
    assert math.isnan(line.hours) and line.source == "not measured yet" and line.gpu_hours == 0
    done = runs[0]
    done.directory.mkdir(parents=True)
    (done.directory / "config.yaml").write_text(yaml.safe_dump(done.settings))
    (done.directory / "done.json").write_text(json.dumps({"env_steps": 1024, "wall_seconds": 360, "gpus": 0}))
    twin = Run(done.experiment, done.variant, 1, tmp_path / "other", {**done.settings, "seed": 1})
    (line,) = plan([twin], 0, "ignored", load_calibration(table, tmp_path))
    assert line.source == "measured" and line.hours == pytest.approx(0.1)  # 1024 steps in 6 minutes
