"""docs/studies/run-length.md: final success and the critic's agreement with the planner against the run's length.

    python -m sacglam_core.studies.run_length [--experiments run_length_1x run_length_4x run_length_10x]

For each experiment (a length) and variant, over its finished seeds: the final success, the AUC, the last
evaluation's `planner_q_share` (SAC) and `planner_policy_share`, and the prior's `planner_policy_share` (the step-0
row), each as a mean with its 95% bootstrap interval over seeds; and how many seeds' critics rank better than the
prior by two of the probe's standard errors (the page's reading). Writes `run_length.md`, `.csv` and `.png`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.pipeline.experiments import DEFINITION_FILES, expand, load_definitions
from sacglam_core.reports.aggregate import load_experiment, per_run, stratified_bootstrap

PROBE_STATES = 256  # monitor.planner_probe's default: the probe's standard error is sqrt(p (1 - p) / 256)


def interval(values: np.ndarray) -> tuple[float, float, float]:
    """The mean over seeds and its 95% bootstrap interval (NaN where nothing finished)."""
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan, math.nan, math.nan
    low, high = stratified_bootstrap(lambda m: float(m.mean()), values[:, None])
    return float(values.mean()), low, high


def measure(experiment: str, results: Path, models: str) -> pd.DataFrame:
    runs = expand(load_definitions(*DEFINITION_FILES), [experiment], results, {"models": models})
    loaded = load_experiment(experiment, runs)
    table = per_run(loaded)
    rows = []
    for variant in loaded.variants:
        curves = loaded.curves[loaded.curves["variant"] == variant]
        first = curves.groupby("seed").head(1).set_index("seed")
        last = curves.groupby("seed").tail(1).set_index("seed")

        def column(frame: pd.DataFrame, name: str) -> np.ndarray:
            return pd.to_numeric(frame[name], errors="coerce").to_numpy(float) if name in frame else np.array([])

        critic, prior = column(last, "planner_q_share"), column(first, "planner_policy_share")
        margin = 2 * np.sqrt(prior * (1 - prior) / PROBE_STATES) if len(prior) else np.array([])
        better = int(np.sum(critic > prior + margin)) if len(critic) and len(critic) == len(prior) else 0
        mine = table[table["variant"] == variant]
        row = {"experiment": experiment, "steps": int(runs[0].config.total_steps), "variant": variant,
               "seeds": len(mine), "critic_beats_prior_seeds": better}  # fmt: skip
        for name, values in (
            ("final_success", mine["final_success"].to_numpy(float)),
            ("auc", mine["auc"].to_numpy(float)),
            ("planner_q_share", critic),
            ("planner_policy_share", column(last, "planner_policy_share")),
            ("prior_policy_share", prior),
        ):
            row[name], row[f"{name}_low"], row[f"{name}_high"] = interval(values)
        rows.append(row)
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    colors = {variant: f"C{i}" for i, variant in enumerate(table["variant"].unique())}  # the same in both panels
    lengths = sorted(table["steps"].unique())
    for ax, name, title in (
        (axes[0], "final_success", "final success"),
        (axes[1], "planner_q_share", "argmax Q a best action (planner)"),
    ):
        for variant, rows in table.groupby("variant", sort=False):
            rows = rows.sort_values("steps")
            if rows[name].notna().any():
                errors = [rows[name] - rows[f"{name}_low"], rows[f"{name}_high"] - rows[name]]
                ax.errorbar(
                    rows["steps"], rows[name], yerr=errors, marker="o", capsize=3, label=variant, color=colors[variant]
                )
        if name == "planner_q_share":
            prior = table.groupby("steps")["prior_policy_share"].mean()
            ax.plot(prior.index, prior.to_numpy(), "k--", label="the prior's argmax pi")
        ax.set_xscale("log")
        ax.set_xticks(lengths, [f"{steps:,}" for steps in lengths])
        ax.minorticks_off()
        ax.set_xlabel("environment steps of the run")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", nargs="+", default=["run_length_1x", "run_length_4x", "run_length_10x"])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--models", default="resources/models")
    parser.add_argument("--out", type=Path, default=Path("results/run_length"))
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    table = pd.concat([measure(e, args.results, args.models) for e in args.experiments], ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "run_length.csv", index=False)

    def cell(row: pd.Series, name: str) -> str:
        if math.isnan(row[name]):
            return "-"
        return f"{row[name]:.3f} [{row[f'{name}_low']:.3f}, {row[f'{name}_high']:.3f}]"

    shown = pd.DataFrame(
        {
            "steps": table["steps"].map("{:,}".format),
            "variant": table["variant"],
            "seeds": table["seeds"],
            "final success": [cell(r, "final_success") for _, r in table.iterrows()],
            "AUC": [cell(r, "auc") for _, r in table.iterrows()],
            "argmax Q a best action": [cell(r, "planner_q_share") for _, r in table.iterrows()],
            "argmax pi a best action": [cell(r, "planner_policy_share") for _, r in table.iterrows()],
            "the prior's": [cell(r, "prior_policy_share") for _, r in table.iterrows()],
            "seeds whose critic beats the prior": table["critic_beats_prior_seeds"],
        }
    )
    note = "Means over seeds with their 95% bootstrap intervals; `python -m sacglam_core.studies.run_length`."
    (args.out / "run_length.md").write_text(f"{note}\n\n{shown.to_markdown(index=False)}\n")
    figure(table, args.out / "run_length.png")
    print(shown.to_markdown(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
