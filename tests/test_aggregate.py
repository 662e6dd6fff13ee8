"""Aggregation on synthetic metrics files with known values."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sacglam_core.config import dump_config
from sacglam_core.envs import GoalType
from sacglam_core.evaluation import episodes_for_standard_error, goal_type_prior, metric_name, success_standard_error
from sacglam_core.metrics import COLUMNS
from sacglam_core.pipeline.experiments import ExperimentError, Run, expand, load_definitions
from sacglam_core.reports.aggregate import (
    Experiment,
    area_under_curve,
    curves_mean_std,
    diagnostics_table,
    goal_bucket_curves,
    iqm,
    load_experiment,
    per_run,
    probability_of_improvement,
    stratified_bootstrap,
    summary_table,
)
from sacglam_core.reports.claims import check, random_success
from sacglam_core.reports.claims import main as claims_main
from sacglam_core.reports.figures import curves_figure, diagnostics_figure, goals_figure
from sacglam_core.reports.outputs import expected_outputs, write_experiment_results
from sacglam_core.reports.outputs import main as outputs_main
from sacglam_core.reports.tables import DIFFERS, hyperparameters, hyperparameters_markdown, summary_markdown

DEFINITIONS = {
    "defaults": {  # evaluations at steps 0, 100, 200, 300 and 400
        "model": {"name_or_path": "tiny"},
        "total_steps": 400,
        "num_envs": 4,
        "eval": {"every_steps": 100},
        "env": {"simplified": True, "n_objects": 3},
    },
    "experiments": {
        "demo": {
            "seeds": [0, 1, 2],
            "figures": {"figure2": {"x": ["env_steps", "wall_hours"]}, "figure7": {"y": "her_share"}},
            "variants": {"PPO": {"algorithm": "ppo"}, "SAC+HER": {"algorithm": "sac", "her": {"enabled": True}}},
        }
    },
}
STEPS = [0, 100, 200, 300, 400]
ROOT = Path(__file__).resolve().parents[1]


def write_run(run: Run, success: list[float], finished: bool = True, **columns: list[float]) -> None:
    run.directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (step, s) in enumerate(zip(STEPS, success)):
        row = dict.fromkeys(COLUMNS, "")
        row |= {"env_steps": step, "wall_seconds": 36.0 * i, "train_seconds": 30.0 * i, "eval_success": s,
                "eval_success_grasp": s,
                "eval_success_grow": s / 2, "eval_success_test": s / 4, "her_share": 0.1 * i}  # fmt: skip
        row |= {column: values[i] for column, values in columns.items()}  # the test's own columns win
        rows.append(row)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(run.directory / "metrics.csv", index=False)
    (run.directory / "config.yaml").write_text(dump_config(run.config))  # as the trainer writes it
    if finished:  # as the trainer writes it
        done = {"env_steps": 400, "wall_seconds": 144.0, "eval_success": success[-1], "gpus": 4, "dtype": "bfloat16",
                "lora_target_modules": None, "fingerprint": run.config.fingerprint}  # fmt: skip
        (run.directory / "done.json").write_text(json.dumps(done))


@pytest.fixture
def experiment_dir(tmp_path):
    runs = expand(DEFINITIONS, ["demo"], tmp_path)
    curves = {  # SAC+HER: seeds 0, 1, 2 with known curves; PPO: seed 2 missing (unfinished)
        ("SAC+HER", 0): [0.0, 0.25, 0.5, 0.75, 1.0],
        ("SAC+HER", 1): [0.0, 0.5, 0.5, 1.0, 1.0],
        ("SAC+HER", 2): [0.0, 0.0, 0.25, 0.5, 0.75],
        ("PPO", 0): [0.0, 0.1, 0.2, 0.3, 0.4],
        ("PPO", 1): [0.0, 0.2, 0.4, 0.6, 0.8],
        ("PPO", 2): [0.0, 0.9, 0.9, 0.9, 0.9],
    }
    for run in runs:
        write_run(run, curves[(run.variant, run.seed)], finished=(run.variant, run.seed) != ("PPO", 2))
    return tmp_path, runs


def test_curves_mean_and_std_across_seeds(experiment_dir):
    _, runs = experiment_dir
    experiment = load_experiment("demo", runs)
    curves = curves_mean_std(experiment).set_index(["variant", "env_steps"])
    assert curves.loc[("SAC+HER", 100), "mean"] == pytest.approx(0.25)
    assert curves.loc[("SAC+HER", 100), "std"] == pytest.approx(np.std([0.25, 0.5, 0.0], ddof=1))
    assert curves.loc[("PPO", 400), "mean"] == pytest.approx(0.6)  # the unfinished seed 2 is left out
    assert curves.loc[("PPO", 400), "seeds"] == 2
    hours = curves_mean_std(experiment, x="wall_hours").set_index(["variant", "env_steps"])
    assert hours.loc[("PPO", 200), "x"] == pytest.approx(72 / 3600)
    training = curves_mean_std(experiment, x="train_hours").set_index(["variant", "env_steps"])
    assert training.loc[("PPO", 200), "x"] == pytest.approx(60 / 3600)


def test_figure_2_plots_success_against_training_time(experiment_dir):
    """The paper's time panel: acting and updates only, as evaluations and checkpoints weigh differently
    on PPO and SAC."""
    _, runs = experiment_dir
    main = load_definitions(ROOT / "workflow" / "config" / "experiments.yaml")["experiments"]["main"]
    assert main["figures"]["figure2"]["x"] == ["env_steps", "train_hours"]
    figure = curves_figure(load_experiment("demo", runs), main["figures"]["figure2"], "Figure 2")
    time = figure.axes[1]
    assert time.get_xlabel().startswith("training time (minutes)") and "without evaluation" in time.get_xlabel()
    assert time.lines[0].get_xdata().max() == pytest.approx(120 / 60)  # 30 s per evaluation interval, in minutes


def test_figure_2s_axis_labels_fit_their_panels(experiment_dir):
    """Each label as drawn stays within its panel's span (a few pixels of slack) and within the figure."""
    _, runs = experiment_dir
    main = load_definitions(ROOT / "workflow" / "config" / "experiments.yaml")["experiments"]["main"]
    figure = curves_figure(load_experiment("demo", runs), main["figures"]["figure2"], "Figure 2")
    figure.canvas.draw()  # places the labels
    renderer = figure.canvas.get_renderer()
    page, margin = figure.bbox, 10  # pixels
    for ax in figure.axes:
        panel = ax.get_window_extent(renderer)
        x_label, y_label = (axis.label.get_window_extent(renderer) for axis in (ax.xaxis, ax.yaxis))
        assert panel.x0 - margin <= x_label.x0 and x_label.x1 <= panel.x1 + margin, ax.get_xlabel()
        assert panel.y0 - margin <= y_label.y0 and y_label.y1 <= panel.y1 + margin, ax.get_ylabel()
        for label in (x_label, y_label):
            assert page.x0 <= label.x0 and label.x1 <= page.x1 and page.y0 <= label.y0 and label.y1 <= page.y1


def test_the_success_band_is_mean_and_std_within_0_and_1(experiment_dir):
    _, runs = experiment_dir
    figure = curves_figure(load_experiment("demo", runs), {}, "Figure 2")  # PPO at 100: 0.1 and 0.2, mean 0.15
    bands = [np.concatenate([p.vertices for p in band.get_paths()]) for band in figure.axes[0].collections]
    assert min(b[:, 1].min() for b in bands) == 0.0 and max(b[:, 1].max() for b in bands) <= 1.0
    assert "the band clipped to [0, 1]" in figure._suptitle.get_text()
    her = curves_figure(load_experiment("demo", runs), {"y": "her_share"}, "Figure 7")
    assert "clipped" not in her._suptitle.get_text()


def test_diagnostics_per_run_and_per_variant(experiment_dir):
    """A seed that collapses and one that learns: the table keeps each run's lowest success and largest KL (of one
    measurement where the run logs it, else of a row's mean)."""
    _, runs = experiment_dir
    diagnostics = {
        0: {"policy_kl": [float("nan"), 0.5, 2.0, 0.1, 0.1], "entropy": [1.0, 0.5, 0.01, 0.01, 0.01],
            "alpha": [0.05] * 5,
            "target_policy_entropy": [1.0, 0.1, 0.0, 0.0, 0.0], "q_range": [0.1, 1.0, 2.0, 2.0, 2.0]},
        1: {"policy_kl": [float("nan"), 0.01, 0.02, 0.03, 0.02], "policy_kl_max": [float("nan"), 0.02, 0.5, 0.04, 0.03],
            "entropy": [1.0, 0.9, 0.8, 0.7, 0.6],
            "alpha": [0.05] * 5,
            "target_policy_entropy": [1.0, 0.8, 0.8, 0.7, 0.7], "q_range": [0.1, 0.2, 0.3, 0.3, 0.3]},
    }  # fmt: skip
    for run in runs:
        if run.variant == "SAC+HER" and run.seed in diagnostics:
            write_run(
                run, [0.3, 0.0, 0.0, 0.1, 0.2] if run.seed == 0 else [0.3, 0.4, 0.5, 0.6, 0.7], **diagnostics[run.seed]
            )
    table = diagnostics_table(load_experiment("demo", runs)).set_index(["variant", "seed"])
    collapsed, healthy = table.loc[("SAC+HER", 0)], table.loc[("SAC+HER", 1)]
    assert (collapsed["start_success"], collapsed["lowest_success"], collapsed["final_success"]) == (0.3, 0.0, 0.2)
    assert collapsed["policy_kl_max"] == 2.0 and collapsed["policy_kl_mean"] == pytest.approx(2.7 / 4)
    assert healthy["policy_kl_max"] == 0.5  # one measurement's jump, which the rows' means hide
    assert collapsed["entropy_final"] == 0.01 and healthy["target_policy_entropy_final"] == 0.7
    mean = table.loc[("SAC+HER", "mean")]
    seeds = table.loc["SAC+HER"].drop(index="mean")
    assert mean["lowest_success"] == pytest.approx(seeds["lowest_success"].mean())
    assert math.isnan(table.loc[("PPO", "mean"), "q_range_final"])  # no diagnostics written: left empty, not 0
    figure = diagnostics_figure(load_experiment("demo", runs))
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles[0] == "success rate" and any(t.startswith("KL") for t in titles) and "SAC: alpha" in titles


def test_the_goal_samplers_buckets_and_known_goals_are_read_and_drawn(experiment_dir):
    _, runs = experiment_dir
    for run in runs:
        if run.variant == "SAC+HER" and run.seed in (0, 1):
            buckets = [json.dumps({"share/grasp animal": 1 - k / 4, "share/grow animal": k / 4, "lp/grasp animal": 0.1,
                                   "lp/grow animal": 0.2 * k}) for k in range(5)]  # fmt: skip
            write_run(run, [0.0, 0.2, 0.4, 0.6, 0.8], goals_known=[0, 2, 4, 6, 8], goal_buckets=buckets)
        if run.variant == "PPO" and run.seed == 0:  # as `discovered` writes them: shares, no learning progress
            write_run(run, [0.0] * 5, goal_buckets=[json.dumps({"share/grasp animal": 1.0})] * 5)
    experiment = load_experiment("demo", runs)
    curves = goal_bucket_curves(experiment)
    assert set(curves["bucket"]) == {"grasp animal", "grow animal"} and set(curves["seed"]) == {0, 1}
    last = curves[(curves["env_steps"] == 400) & (curves["bucket"] == "grow animal")]
    assert list(last["share"]) == [1.0, 1.0] and list(last["lp"]) == pytest.approx([0.8, 0.8])
    figure = goals_figure(experiment, "goals")
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles[0].startswith("goals known") and "SAC+HER:\nshare of the goals drawn per bucket" in titles
    assert "PPO:\nshare of the goals drawn per bucket" in titles and "PPO:\nlearning progress per bucket" not in titles
    assert max(figure.axes[0].lines[-1].get_ydata()) == 8  # the mean of the two seeds' known goals at the end


def test_a_bucket_one_seed_has_not_found_counts_as_no_share_of_its_draws(experiment_dir):
    """The mean shares over seeds add up to 1 where a seed knows fewer buckets than another."""
    _, runs = experiment_dir
    for run in runs:
        if run.variant == "SAC+HER" and run.seed in (0, 1):
            shares = (
                {"share/grasp animal": 0.5, "share/grow animal": 0.5} if run.seed == 0 else {"share/grasp animal": 1}
            )
            write_run(run, [0.0, 0.2, 0.4, 0.6, 0.8], goal_buckets=[json.dumps(shares)] * 5)
    curves = goal_bucket_curves(load_experiment("demo", runs))
    means = curves.groupby(["env_steps", "bucket"])["share"].mean().unstack("bucket")
    assert means.sum(axis=1).tolist() == pytest.approx([1.0] * 5)
    assert means["grow animal"].tolist() == pytest.approx([0.25] * 5)


def test_auc_and_steps_to_threshold():
    assert area_under_curve(np.array(STEPS, float), np.array([0.0, 0.25, 0.5, 0.75, 1.0])) == pytest.approx(0.5)
    assert area_under_curve(np.array(STEPS, float), np.ones(5)) == pytest.approx(1.0)


def test_summary_table_values_and_missing_seeds(experiment_dir):
    _, runs = experiment_dir
    experiment = load_experiment("demo", runs)
    assert experiment.missing() == {"PPO": [2]}
    assert experiment.label("PPO") == "PPO (n=2/3)"
    summary = summary_table(experiment).set_index("variant")
    sac = summary.loc["SAC+HER"]
    assert sac["seeds"] == "3/3"
    assert sac["final_success_mean"] == pytest.approx(np.mean([1.0, 1.0, 0.75]))
    assert sac["final_success_std"] == pytest.approx(np.std([1.0, 1.0, 0.75], ddof=1))
    # trapezoids of width 100 over 400 steps: (0.125 + 0.375 + 0.625 + 0.875) / 4, and so on
    aucs = [0.5, (0.25 + 0.5 + 0.75 + 1.0) / 4, (0.0 + 0.125 + 0.375 + 0.625) / 4]
    assert sac["auc_mean"] == pytest.approx(np.mean(aucs))
    # steps to 50%: 200, 100, 300 ; to 80%: 400, 300, never
    assert sac["steps_to_50_mean"] == pytest.approx(200) and sac["steps_to_50_reached"] == "3/3"
    assert sac["steps_to_80_mean"] == pytest.approx(350) and sac["steps_to_80_reached"] == "2/3"
    assert sac["success_grow_mean"] == pytest.approx(np.mean([0.5, 0.5, 0.375]))
    assert sac["test_success_mean"] == pytest.approx(np.mean([0.25, 0.25, 0.1875]))
    assert sac["env_steps_per_s_mean"] == pytest.approx(400 / 144)
    assert sac["gpu_hours_mean"] == pytest.approx(4 * 144 / 3600)
    assert summary.loc["PPO", "seeds"] == "2/3"
    # the evaluation's own standard error: grasp at s and grow at s / 2 over n episodes each, weighted by the
    # goal types' shares; seed 0 ends at grasp 1.0 (no variance) and grow 0.5, seed 2 at 0.75 and 0.375
    p, n = dict(zip(GoalType, goal_type_prior(runs[0].config.env))), runs[0].config.eval.episodes_per_type
    se = [math.sqrt(p[GoalType.GRASP] ** 2 * g * (1 - g) / n + p[GoalType.GROW] ** 2 * w * (1 - w) / n)
          for g, w in ((1.0, 0.5), (1.0, 0.5), (0.75, 0.375))]  # fmt: skip
    assert sac["final_success_se_mean"] == pytest.approx(np.mean(se))
    assert (
        summary_markdown(summary_table(experiment))["evaluation SE, final (largest)"]
        .iloc[1]
        .startswith(f"{np.mean(se):.3f} (")
    )


def test_every_ranking_experiment_evaluates_enough_episodes_for_a_standard_error_of_3_points():
    """At the worst case (every goal type at 0.5), the weighted final success of the paper's experiments and of
    the demo has a standard error of at most 0.03 (not the install checks: smoke, gpu_smoke)."""
    definitions = load_definitions(ROOT / "workflow/config/experiments.yaml")
    for name in [n for n in definitions["experiments"] if n not in ("smoke", "gpu_smoke")]:
        for run in paper_experiment_runs(name):
            needed = episodes_for_standard_error(run.config.env, 0.03)
            assert run.config.eval.episodes_per_type >= needed, (name, run.variant, needed)
            worst = {metric_name(t): 0.5 for t in GoalType}
            assert success_standard_error(worst, run.config) <= 0.03


def test_iqm_and_probability_of_improvement():
    scores = np.arange(8, dtype=float).reshape(4, 2)  # 8 run x task scores: 0..7
    assert iqm(scores) == pytest.approx(np.mean([2, 3, 4, 5]))  # the middle half
    better, worse = np.ones((5, 2)), np.zeros((5, 2))
    assert probability_of_improvement(better, worse) == 1.0
    assert probability_of_improvement(worse, better) == 0.0
    assert probability_of_improvement(better, better) == 0.5
    mixed = np.array([[1.0], [0.0]])
    assert probability_of_improvement(mixed, np.array([[0.5], [0.5]])) == 0.5
    low, high = stratified_bootstrap(iqm, np.random.default_rng(0).normal(size=(50, 2)))
    assert low < 0 < high and high - low < 1


def test_malformed_metrics_file_names_the_file(experiment_dir):
    _, runs = experiment_dir
    bad = runs[0].directory / "metrics.csv"
    key = (runs[0].variant, runs[0].seed)
    for content, message in [
        (b"env_steps,eval_success\n0,0.1\n", f"metrics file {bad} lacks the columns ['wall_seconds']"),
        (b"env_steps,wall_seconds,eval_success\n0,0,zero\n", f"metrics file {bad} has non-numeric"),
        (b"\x00\x01garbage", f"metrics file {bad} lacks the columns"),
    ]:
        bad.write_bytes(content)
        experiment = load_experiment("demo", runs)
        assert experiment.left_out[key].startswith(message) and key[1] not in experiment.seeds(key[0])


def test_hyperparameter_tables_come_from_the_configs(experiment_dir):
    _, runs = experiment_dir
    table = hyperparameters(load_experiment("demo", runs))
    sac = table[table["table"] == "Table 3: SAC-GLAM+HER"].set_index("parameter")["SAC+HER"]
    assert sac["Update frequency"] == 32 and sac["n-step"] == 3 and sac["Replay buffer capacity"] == 100000
    assert sac["Entropy coefficient"] == "auto"
    assert sac["HER batch sampling"] == "ratio" and sac["HER share per batch"] == 0.5
    ppo = table[table["table"] == "Table 1: PPO-GLAM"].set_index("parameter")["PPO"]
    assert ppo["Number of transitions collected between two updates"] == 2048 and ppo["Clipping parameter ε"] == 0.2
    assert not (table["table"] == "Table 2: SAC-GLAM").any()
    table3 = table[table["table"] == "Table 3: SAC-GLAM+HER"].set_index("parameter")
    assert table3.loc["Critic warm-up (update cycles)", "SAC+HER"] == 11
    assert table3.loc["LoRA target modules", "paper"] == "default" and table3.loc["Compute dtype", "paper"] == "auto"
    assert table3.loc["Compute dtype", "SAC+HER"] == "auto: bfloat16"  # what `auto` became in the runs (done.json)
    differs = table3[DIFFERS]
    # the demo leaves SAC-GLAM+HER's entropy settings (Appendix C: 0.05 and 0.01) at SAC-GLAM's defaults
    assert (
        table3.loc["Entropy coefficient initialization", "paper"] == 0.05
        and differs["Entropy coefficient initialization"] == "SAC+HER"
    )
    assert differs["Target entropy"] == "SAC+HER" and differs["Model"] == "SAC+HER"
    assert differs["Update frequency"] == "" and differs["n-step"] == ""
    assert table3.loc["Environment steps", "paper"] == 400_000 and table3.loc["Environment steps", "SAC+HER"] == 400


def test_variant_names_holding_commas_are_bolded_whole():
    """`autotelic_mini_tuning`'s variants are named "..., window 100": the Markdown copy bolds each variant's cell."""
    a, b, c = "SAC, window 100", "SAC, window 40", "SAC"
    table = pd.DataFrame(
        [
            ["T", "window", 100, 100, 40, 7, f"{b}, {c}"],
            ["T", "lr", 1, 2, 2, 2, f"{a}, {b}, {c}"],
            ["T", "n", 3, 3, 3, 3, ""],
        ],
        columns=["table", "parameter", "paper", a, b, c, DIFFERS],
    )
    marked = hyperparameters_markdown(table)
    assert marked.loc[0, [a, b, c]].tolist() == [100, "**40**", "**7**"]
    assert marked.loc[1, [a, b, c]].tolist() == ["**2**", "**2**", "**2**"]
    assert marked.loc[2, [a, b, c]].tolist() == [3, 3, 3]


def test_an_unset_setting_reads_none_in_bold_where_the_paper_sets_it(experiment_dir):
    """The demo runs without LoRA: its LoRA rows say `none`, in bold, never an empty bold `****`."""
    results, runs = experiment_dir
    write_experiment_results(load_experiment("demo", runs), DEFINITIONS["experiments"]["demo"], results)
    markdown = (results / "demo" / "hyperparameters.md").read_text()
    assert "****" not in markdown
    lora_rank = next(line for line in markdown.splitlines() if "Table 3" in line and "| LoRA rank " in line)
    assert "| **none** " in lora_rank and lora_rank.rstrip(" |").endswith("SAC+HER")


def paper_experiment_runs(name: str) -> list[Run]:
    definitions = load_definitions(ROOT / "workflow" / "config" / "experiments.yaml")
    return expand(definitions, [name], "results", {"models": "resources/models"})


def paper_experiment(name: str) -> Experiment:
    runs = paper_experiment_runs(name)
    configs = {r.variant: r.config for r in runs}
    return Experiment(name, pd.DataFrame(), {}, {v: [0] for v in configs}, configs)


def test_main_runs_the_papers_settings_and_mini_shows_its_differences():
    main = hyperparameters(paper_experiment("main"))
    assert (main[DIFFERS] == "").all(), main[main[DIFFERS] != ""]
    mini = hyperparameters(paper_experiment("mini")).set_index(["table", "parameter"])
    sac = mini.loc["Table 2: SAC-GLAM"]
    differing = set(sac.index[sac[DIFFERS] == "SAC-GLAM"])
    # the paper's regime (docs/studies/paper-regime.md): for time, the paper's critic read from the policy's pass
    # and batches of 64, its target the paper's; spans scaled with the run; a smaller model on a smaller task
    assert {"Critic input", "Batch size"} <= differing and "sac.critic.target_lm" not in differing
    assert {"Replay buffer capacity", "Critic warm-up (update cycles)"} <= differing
    assert {"Model", "Horizon", "Simplified (simple goals only)"} <= differing
    # every per-update setting is the paper's, the LoRA adapters included
    same = {"Critic weights", "sac.critic.hidden_units", "Critic learning rate", "Actor learning rate", "Actor loss"}
    same |= {"Entropy coefficient learning rate", "LoRA rank", "LoRA alpha", "LoRA target modules"}
    assert same.isdisjoint(differing), same & differing
    assert {"Target entropy", "sac.critic.tau", "Number of updates", "Update frequency", "n-step"}.isdisjoint(differing)
    assert sac.loc["Discount factor", "SAC-GLAM"] == 0.99 == sac.loc["Discount factor", "paper"]
    ppo = mini.loc["Table 1: PPO-GLAM"]
    ppo_differing = set(ppo.index[ppo[DIFFERS] == "PPO-GLAM"])
    assert {"Number of epochs per update", "Batch size"} <= ppo_differing  # for time, as SAC's batches
    assert "Number of transitions collected between two updates" in ppo_differing  # rollouts of 512: PPO's failure
    ppo_same = {"Learning rate", "Discount factor", "LoRA rank"}
    assert ppo_same.isdisjoint(ppo_differing), ppo_same & ppo_differing


def test_the_demos_task_leaves_a_random_policy_at_most_15_percent():
    """The demo's task is one where hindsight matters: a random policy succeeds at most
    15% of the time on the runs' own evaluation plan (the baseline the claims compare against)."""
    runs = paper_experiment_runs("mini")
    assert len({(repr(r.config.env), repr(r.config.eval)) for r in runs}) == 1, "every run plays the same task"
    assert random_success(runs[0].config) <= 0.15


def test_every_output_is_written_and_says_what_is_missing(experiment_dir):
    results, runs = experiment_dir
    paths = write_experiment_results(load_experiment("demo", runs), DEFINITIONS["experiments"]["demo"], results)
    assert sorted(paths) == sorted(expected_outputs("demo", DEFINITIONS["experiments"]["demo"], results))
    assert all(p.stat().st_size > 0 for p in paths)
    assert "Missing seeds: PPO: [2]" in (results / "demo" / "summary.md").read_text()
    hyperparameters_md = (results / "demo" / "hyperparameters.md").read_text()
    assert "differ from it" in hyperparameters_md and "| **tiny** " in hyperparameters_md
    assert "nan" not in hyperparameters_md
    per_seed = per_run(load_experiment("demo", runs))
    assert len(per_seed) == 5 and not math.isnan(per_seed["auc"].iloc[0])


def test_claims_hold_or_fail_on_known_curves(experiment_dir):
    _, runs = experiment_dir
    experiment = load_experiment("demo", runs)
    ppo, ppo_random, sac, sac_random = check(experiment, {"learns": ["PPO", "SAC+HER"], "margin": 0.2}, 0.5)
    assert ppo.statement == "PPO learns: P(final success > its own start + 0.2) >= 0.8"
    assert ppo.holds and "P = 1.00" in ppo.evidence and "its own start 0.000" in ppo.evidence  # 0.4 and 0.8 from 0
    assert not ppo_random.holds and "P = 0.50" in ppo_random.evidence  # only 0.8 beats 0.5 + 0.2
    assert sac.holds and sac_random.holds and "0.917" in sac.evidence
    # AUCs: SAC+HER 0.5, 0.625, 0.28125 (mean 0.46875); PPO 0.2, 0.4; 5 of the 6 pairs favour SAC+HER.
    (better,) = check(experiment, {"better": [{"x": "SAC+HER", "y": "PPO", "at_least": 0.8}]}, 0.5)
    assert better.holds and "P = 0.83 [95% CI " in better.evidence and "6 seed pairs" not in better.evidence
    assert "over 3 x 2 seed pairs" in better.evidence and "0.469" in better.evidence
    low, high = map(float, better.evidence.split("CI ")[1].split("]")[0].split(", "))
    assert low < 0.83 < high <= 1.0  # 5 seeds or fewer: a wide interval, printed beside the estimate
    assert ("no ordering either way" in better.evidence) == (low <= 0.5)
    (stricter,) = check(experiment, {"better": [{"x": "SAC+HER", "y": "PPO", "at_least": 0.9}]}, 0.5)
    assert not stricter.holds  # thresholds apply to P, never to the means (SAC+HER's mean is higher)
    (reversed_order,) = check(experiment, {"better": [{"x": "PPO", "y": "SAC+HER", "at_least": 0.5}]}, 0.5)
    assert not reversed_order.holds and "P = 0.17" in reversed_order.evidence


def test_a_run_that_does_not_move_from_its_start_does_not_learn(tmp_path):
    """A variant whose runs start where a prior puts them and stay there beats the random policy, and learns
    nothing: the `learns` claim measures each run from its own step-0 evaluation."""
    runs = expand(DEFINITIONS, ["demo"], tmp_path)
    for run in runs:
        flat = [0.376] * 5 if run.variant == "SAC+HER" else [0.3, 0.4, 0.5, 0.6, 0.6 + 0.05 * run.seed]
        write_run(run, flat)
    experiment = load_experiment("demo", runs)
    sac, sac_random, ppo, _ = check(experiment, {"learns": ["SAC+HER", "PPO"], "margin": 0.05}, 0.138)
    assert not sac.holds and "P = 0.00" in sac.evidence and "its own start 0.376" in sac.evidence
    assert sac_random.holds and "P = 1.00" in sac_random.evidence  # 0.376 > 0.138 + 0.05 on every seed
    assert ppo.holds and "its own start 0.300" in ppo.evidence
    (lenient,) = check(experiment, {"learns": ["SAC+HER"], "margin": 0.0, "learns_at_least": 0.0}, 0.138)[:1]
    assert lenient.holds  # a share of 0 is at least 0: the threshold is the claim's, as stated


def test_claims_on_one_goal_type_read_that_types_curve(experiment_dir):
    """`goal_type: grow` compares the AUC of grow goals' success: here the reverse of the overall order, so the claim
    on all goals holds and the one on grow goals fails."""
    _, runs = experiment_dir
    grow = {"SAC+HER": [0.0, 0.0, 0.0, 0.1, 0.1], "PPO": [0.0, 0.3, 0.3, 0.3, 0.4]}
    for run in runs:
        overall = pd.read_csv(run.directory / "metrics.csv")["eval_success"].tolist()
        write_run(run, overall, finished=(run.variant, run.seed) != ("PPO", 2), eval_success_grow=grow[run.variant])
    experiment = load_experiment("demo", runs)
    claims = [{"x": "SAC+HER", "y": "PPO", "at_least": 0.8}, {"x": "SAC+HER", "y": "PPO", "at_least": 0.8}]
    claims[1]["goal_type"] = "grow"
    everything, on_grow = check(experiment, {"better": claims}, 0.5)
    assert everything.holds and everything.statement == "P(AUC SAC+HER > PPO) >= 0.8"
    assert not on_grow.holds and on_grow.statement == "P(AUC of grow SAC+HER > PPO) >= 0.8"
    assert "P = 0.00" in on_grow.evidence and "AUC of grow 0.037 ± 0.000 vs 0.275 ± 0.000" in on_grow.evidence
    with pytest.raises(ExperimentError, match="goal_type 'swim' is not one of"):
        check(experiment, {"better": [{"x": "SAC+HER", "y": "PPO", "at_least": 0.8, "goal_type": "swim"}]}, 0.5)
    sequential = {"x": "SAC+HER", "y": "PPO", "at_least": 0.5, "goal_type": "grow then grasp"}
    (unevaluated,) = check(experiment, {"better": [sequential]}, 0.5)
    assert not unevaluated.holds and "grow then grasp is not evaluated at every point" in unevaluated.evidence


def test_time_claims_compare_mean_training_time(experiment_dir):
    _, runs = experiment_dir
    for run in runs:
        if run.variant == "SAC+HER":  # 240 s of training against PPO's 120 (metrics rows), wall time aside
            done = json.loads((run.directory / "done.json").read_text())
            (run.directory / "done.json").write_text(json.dumps({**done, "train_seconds": 240.0}))
    experiment = load_experiment("demo", runs)
    (fits,) = check(experiment, {"time": [{"x": "SAC+HER", "y": "PPO", "at_most": 2.0}]}, 0.5)
    assert fits.holds and fits.evidence.startswith("ratio 2.00 [95% CI 2.00, 2.00]")
    (too_slow,) = check(experiment, {"time": [{"x": "SAC+HER", "y": "PPO", "at_most": 1.5}]}, 0.5)
    assert not too_slow.holds


def test_claims_reject_unknown_variants_and_keys(experiment_dir):
    _, runs = experiment_dir
    experiment = load_experiment("demo", runs)
    with pytest.raises(ExperimentError, match="unknown variants \\['DQN'\\]"):
        check(experiment, {"better": [{"x": "DQN", "y": "PPO", "at_least": 0.6}]}, 0.5)
    with pytest.raises(ExperimentError, match="unknown keys \\['order'\\]"):
        check(experiment, {"order": ["SAC+HER", "PPO"]}, 0.5)  # means-based orderings are gone
    with pytest.raises(ExperimentError, match="at_least must be a number in \\[0.0, 1.0\\], got 1.5"):
        check(experiment, {"better": [{"x": "SAC+HER", "y": "PPO", "at_least": 1.5}]}, 0.5)
    with pytest.raises(ExperimentError, match="needs exactly the keys x, y and at_most"):
        check(experiment, {"time": [{"x": "SAC+HER", "y": "PPO", "at_least": 2}]}, 0.5)


def test_claims_are_validated_when_the_definitions_are_read():
    """A misspelt variant in a claim fails the dry run, not the claims command after the training."""
    definitions = {**DEFINITIONS, "experiments": {"demo": {**DEFINITIONS["experiments"]["demo"], "claims": {
        "better": [{"x": "SAC+HER", "y": "PPOO", "at_least": 0.6}]}}}}  # fmt: skip
    with pytest.raises(ExperimentError, match="claims name unknown variants \\['PPOO'\\]"):
        expand(definitions, ["demo"], "results")


def test_a_row_missing_its_trailing_fields_is_rejected(experiment_dir):
    _, runs = experiment_dir
    bad = runs[0].directory / "metrics.csv"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([*lines[:-1], lines[-1].rsplit(",", 5)[0]]) + "\n")  # a row cut short
    left_out = load_experiment("demo", runs).left_out[(runs[0].variant, runs[0].seed)]
    assert left_out.startswith(f"metrics file {bad} has a truncated row: line 6 has")


@pytest.mark.parametrize("content", [b"", b'{"env_steps": 4', b"\xff\xfe", b"[1, 2]", b'{"env_steps": 400}'])
def test_a_corrupt_done_file_is_named(experiment_dir, content):
    _, runs = experiment_dir
    done = runs[0].directory / "done.json"
    done.write_bytes(content)
    assert f"run summary {done}" in load_experiment("demo", runs).left_out[(runs[0].variant, runs[0].seed)]


def test_claims_on_some_seeds_only(experiment_dir, tmp_path, capsys):
    """--seeds checks the claims on a subset of the experiment's seeds (a replication on seeds the settings were
    not chosen on); a seed the experiment does not have is one line and status 2."""
    results, _ = experiment_dir
    definitions = {**DEFINITIONS, "experiments": {"demo": {**DEFINITIONS["experiments"]["demo"], "claims": {
        "better": [{"x": "SAC+HER", "y": "PPO", "at_least": 0.9}]}}}}  # fmt: skip
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(definitions))
    command = ["demo", "--definitions", str(tmp_path / "experiments.yaml"), "--results", str(results)]
    assert claims_main(command) == 1  # all seeds: P = 0.83 (5 of 6 pairs)
    assert "P = 0.83" in capsys.readouterr().out
    assert claims_main([*command, "--seeds", "0", "1"]) == 0  # SAC+HER 0.5, 0.625 against PPO 0.2, 0.4
    out = capsys.readouterr().out
    assert out.startswith("on seeds 0, 1 of demo only\n") and "P = 1.00" in out and "over 2 x 2 seed pairs" in out
    assert claims_main([*command, "--seeds", "1", "7"]) == 2
    err = capsys.readouterr().err
    assert err == "error: experiment 'demo' has no seeds [7]\n"


def test_claims_over_a_late_window(experiment_dir, tmp_path, capsys):
    """--from-step computes each run's AUC over its evaluations from that step on; a step that leaves a run
    fewer than two evaluations is one line and status 2."""
    results, _ = experiment_dir
    definitions = {**DEFINITIONS, "experiments": {"demo": {**DEFINITIONS["experiments"]["demo"], "claims": {
        "better": [{"x": "SAC+HER", "y": "PPO", "at_least": 0.8}]}}}}  # fmt: skip
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(definitions))
    command = ["demo", "--definitions", str(tmp_path / "experiments.yaml"), "--results", str(results)]
    assert claims_main([*command, "--from-step", "200"]) == 0
    out = capsys.readouterr().out
    # From step 200: SAC+HER 0.75, 0.875, 0.5 (mean 0.708); PPO 0.3, 0.6 (all steps: 0.469 against 0.3).
    assert out.startswith("AUCs over the evaluations from step 200 on\n") and "AUC 0.708 ± " in out
    assert "vs 0.450 ± " in out
    for step in ("400", "-1"):
        assert claims_main([*command, "--from-step", step]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --from-step {step} leaves fewer than two evaluations in a run of 'demo'\n"


def _rewrite_lines(path: Path, change) -> None:
    path.write_text("\n".join(change(path.read_text().splitlines())) + "\n")


def _set_final_success(lines: list[str]) -> list[str]:
    header = lines[0].split(",")
    last = lines[-1].split(",")
    last[header.index("eval_success")] = "0.9"
    return [*lines[:-1], ",".join(last)]


def _edit_config(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    config["sac"]["gamma"] = 0.5
    path.write_text(yaml.safe_dump(config))


DAMAGES = {  # what befalls a finished run's files -> what the warning says (after the file's name)
    "metrics deleted": (lambda d: (d / "metrics.csv").unlink(), "metrics.csv: [Errno 2] No such file"),
    "last rows cut": (lambda d: _rewrite_lines(d / "metrics.csv", lambda ls: ls[:-3]), "ends at step 100, but "),
    "repeated row": (lambda d: _rewrite_lines(d / "metrics.csv", lambda ls: [*ls[:3], ls[2], *ls[3:]]), "repeats the "
                     "evaluations at steps 100"),
    "missing row": (lambda d: _rewrite_lines(d / "metrics.csv", lambda ls: [*ls[:3], *ls[4:]]), "lacks the "
                    "evaluations at steps 200"),
    "extra row": (lambda d: _rewrite_lines(d / "metrics.csv", lambda ls: [*ls[:3], ls[3].replace("200,", "150,", 1),
                  *ls[3:]]), "has evaluations at steps 150, which "),
    "final success edited": (lambda d: _rewrite_lines(d / "metrics.csv", _set_final_success), "ends with success 0.9, "
                             "but "),
    "config edited": (lambda d: _edit_config(d / "config.yaml"), "config.yaml has fingerprint "),
    "config deleted": (lambda d: (d / "config.yaml").unlink(), "config.yaml: No such file or directory"),
    "done truncated": (lambda d: (d / "done.json").write_text('{"env_steps": 4'), "done.json: Expecting"),
    "done without fingerprint": (lambda d: (d / "done.json").write_text(json.dumps({"env_steps": 400})), "done.json "
                                 "records no fingerprint"),
}  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_finished_run_whose_files_disagree_is_left_out_with_one_warning(experiment_dir, tmp_path, capsys, damage):
    """A finished run is evidence to check: metrics.csv must hold one row per evaluation of the configuration whose
    fingerprint done.json records, ending at done.json's steps and final success. A run that fails is left out of
    the tables and the claims, with one warning line naming the file; the tables say so; nothing fails."""
    results, runs = experiment_dir
    run = next(r for r in runs if (r.variant, r.seed) == ("SAC+HER", 0))
    change, message = DAMAGES[damage]
    change(run.directory)
    definitions = {**DEFINITIONS, "experiments": {"demo": {**DEFINITIONS["experiments"]["demo"], "claims": {
        "learns": ["SAC+HER"], "margin": 0.0, "learns_at_least": 0.5}}}}  # fmt: skip
    (tmp_path / "experiments.yaml").write_text(yaml.safe_dump(definitions))
    command = ["demo", "--definitions", str(tmp_path / "experiments.yaml"), "--results", str(results)]

    assert outputs_main(command) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("warning: ") and message in err, err
    assert str(run.directory) in err and "SAC+HER seed 0 is left out of demo's tables" in err
    assert "from 4 of 6 runs (1 finished but left out)" in out
    summary = (results / "demo" / "summary.md").read_text()
    assert "Missing seeds: PPO: [2]; SAC+HER: [0], of which left out: SAC+HER: [0]" in summary
    assert "| 2/3 (1 left out) |" in summary
    assert pd.read_csv(results / "demo" / "summary.csv").set_index("variant").loc["SAC+HER", "left_out"] == 1
    table = pd.read_csv(results / "demo" / "hyperparameters.csv").set_index("parameter")
    assert float(table.loc["Discount factor"].query("table == 'Table 3: SAC-GLAM+HER'")["SAC+HER"].item()) == 0.99

    assert claims_main(command) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and message in err
    assert "left out: SAC+HER: [0]" in out and "over 2 seeds" in out and "1.000 from 0.000, 0.750 from 0.000" in out
    beats = next(line for line in out.splitlines() if "beats the random policy" in line and "over 2 seeds" in line)
    assert beats.endswith("(per seed: 1.000, 0.750)")  # one random policy for all seeds, said once: not a start


def test_an_intact_finished_run_passes_every_check(experiment_dir):
    _, runs = experiment_dir
    experiment = load_experiment("demo", runs)
    assert experiment.left_out == {} and experiment.warnings() == []
    assert len(experiment.summaries) == 5 and experiment.missing() == {"PPO": [2]}


def test_how_kernels_run_is_not_a_difference_from_the_paper():
    """Settings that change how kernels run (capture, TF32, 4-bit weights dequantized once...) keep a run's
    fingerprint, so the hyperparameter tables do not list them as differences from the paper either."""
    from sacglam_core.config import HOW_KERNELS_RUN, parse_config
    from sacglam_core.pipeline.experiments import merge
    from sacglam_core.reports.tables import PAPER_MODEL, PAPER_VARIANTS, _other_rows, paper_config

    kernels = {
        "capture": False,
        "static_shapes": True,
        "check_host_reads": True,
        "tf32": False,
        "dequantize_4bit": True,
    }
    assert set(kernels) == set(HOW_KERNELS_RUN)
    paper = paper_config("sac_her")
    mine = parse_config(merge(merge(PAPER_MODEL, PAPER_VARIANTS["sac_her"]), {"model": kernels}))
    assert mine.fingerprint == paper.fingerprint and _other_rows({"mine": mine}, paper, set()) == []
    other = parse_config(merge(merge(PAPER_MODEL, PAPER_VARIANTS["sac_her"]), {"model": {"dtype": "float32"}}))
    assert _other_rows({"mine": other}, paper, set()) == [("model.dtype", "model.dtype")]
