"""The paper's figures with seaborn: success curves (mean and std across seeds) in each experiment's
layout, the HER share (Figure 7) and the goal-type distribution (Figure 4); and each experiment's diagnostics,
run by run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from sacglam_core.atomic import save_figure  # noqa: E402
from sacglam_core.envs import GoalType, catalog  # noqa: E402
from sacglam_core.reports.aggregate import Experiment, curves_mean_std, goal_bucket_curves  # noqa: E402

TRAINING_TIME = "without evaluations and checkpoints"  # on a second line: one panel's width holds either half
X_LABELS = {
    "env_steps": "environment steps",
    "wall_hours": "wall-clock time (hours)",
    "wall_minutes": "wall-clock time (minutes)",
    "train_hours": f"training time (hours)\n{TRAINING_TIME}",
    "train_minutes": f"training time (minutes)\n{TRAINING_TIME}",
}
Y_LABELS = {"eval_success": "success rate", "her_share": "share of HER transitions in the buffer"}
DIAGNOSTIC_PANELS = {  # column -> title
    "eval_success": "success rate",
    "policy_kl": "KL(pi before || pi after) per update",
    "entropy": "entropy of pi (nats)",
    "target_policy_entropy": "SAC: entropy of softmax(Q / alpha)",
    "q_range": "SAC: max - min of Q over the candidates",
    "alpha": "SAC: alpha",
    "planner_policy_share": "argmax pi a best action (planner)",
    "planner_q_share": "SAC: argmax Q a best action (planner)",
    "planner_q_gap": "SAC: Q gap of the planner's action",
    "planner_alpha_logp_gap": "SAC: alpha x log pi gap of it",
}


def is_rate(metric: str) -> bool:
    """A success rate, which lies in [0, 1]."""
    return metric.endswith("success") or "_success_" in metric


def curves_figure(experiment: Experiment, spec: dict, title: str) -> plt.Figure:
    """Panels side by side: one per (panel, x axis) of `spec` (`panels`: title -> variants, `x`: axes)."""
    metric = spec.get("y", "eval_success")
    xs = spec.get("x", ["env_steps"])
    panels = spec.get("panels") or {"": experiment.variants}
    unknown = [v for variants in panels.values() for v in variants if v not in experiment.expected]
    if unknown:
        raise ValueError(f"{title}: panels name unknown variants {unknown}; variants: {experiment.variants}")
    columns = [(name, variants, x) for name, variants in panels.items() for x in xs]
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, len(columns), figsize=(5.2 * len(columns), 4), squeeze=False, sharey=True)
    palette = dict(zip(experiment.variants, sns.color_palette("tab10", len(experiment.variants))))
    for ax, (name, variants, x) in zip(axes[0], columns):
        curves = curves_mean_std(experiment, metric, x) if len(experiment.curves) else pd.DataFrame()
        if x.endswith("_hours") and len(curves) and curves["x"].max() < 1:  # short runs read better in minutes
            curves["x"] *= 60
            x = x.replace("_hours", "_minutes")
        for variant in variants:
            mine = curves[curves["variant"] == variant] if len(curves) else curves
            if mine.empty:
                continue
            color = palette[variant]
            ax.plot(mine["x"], mine["mean"], color=color, label=experiment.label(variant))
            low, high = mine["mean"] - mine["std"].fillna(0), mine["mean"] + mine["std"].fillna(0)
            if is_rate(metric):  # seeds split between collapse and learning would put mean - std below 0
                low, high = low.clip(0, 1), high.clip(0, 1)
            ax.fill_between(mine["x"], low, high, color=color, alpha=0.2)
        ax.set_xlabel(X_LABELS[x])
        ax.set_ylabel(Y_LABELS.get(metric, metric))
        ax.set_title(name)
        ax.legend(fontsize=8, loc="best")
    note = experiment.missing_note()
    note = f"\n{note[0].lower()}{note[1:]}" if note else ""
    band = "mean and std across seeds" + (", the band clipped to [0, 1]" if is_rate(metric) else "")
    fig.suptitle(f"{title} ({experiment.name}): {band}{note}", fontsize=10)
    fig.tight_layout()
    return fig


def _seeds_and_mean(ax: plt.Axes, experiment: Experiment, column: str, palette: dict) -> None:
    """`column` against environment steps for each variant: each seed thin, their mean thick."""
    curves = experiment.curves
    for variant in experiment.variants:
        mine = curves[curves["variant"] == variant]
        values = mine.assign(y=pd.to_numeric(mine[column], errors="coerce")).dropna(subset=["y"])
        if values.empty:
            continue
        for _, run in values.groupby("seed"):
            ax.plot(run["env_steps"], run["y"], color=palette[variant], alpha=0.35, linewidth=0.8)
        mean = values.groupby("env_steps")["y"].mean()
        ax.plot(mean.index, mean.to_numpy(), color=palette[variant], linewidth=2, label=experiment.label(variant))


def diagnostics_figure(experiment: Experiment) -> plt.Figure:
    """What moves each variant, run by run against environment steps: success, the policy's KL per update and
    entropy, and for SAC the target of its actor's loss (softmax(Q / alpha)'s entropy, Q's spread, alpha). Thin
    lines are seeds (a mean hides a seed that collapses), the thick line their mean."""
    curves = experiment.curves
    panels = [c for c in DIAGNOSTIC_PANELS if c in curves and pd.to_numeric(curves[c], errors="coerce").notna().any()]
    panels = panels or ["eval_success"]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows), squeeze=False)
    palette = dict(zip(experiment.variants, sns.color_palette("tab10", len(experiment.variants))))
    for ax, column in zip(axes.flat, panels):
        _seeds_and_mean(ax, experiment, column, palette)
        if column in ("policy_kl", "alpha") and (pd.to_numeric(curves[column], errors="coerce") > 0).any():
            ax.set_yscale("log")
        ax.set_title(DIAGNOSTIC_PANELS[column], fontsize=10)
        ax.set_xlabel(X_LABELS["env_steps"])
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"Diagnostics ({experiment.name}): each seed (thin) and their mean (thick)", fontsize=10)
    fig.tight_layout()
    return fig


def goals_figure(experiment: Experiment, title: str) -> plt.Figure:
    """The goal samplers against environment steps: goals known (each seed thin, their mean thick), and for each
    variant with buckets the share of the goals drawn per bucket and each bucket's learning progress (means over
    seeds)."""
    buckets = goal_bucket_curves(experiment)
    variants = [v for v in experiment.variants if (buckets["variant"] == v).any()]
    sns.set_theme(style="whitegrid", context="notebook")
    rows = 1 + len(variants)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.6 * rows), squeeze=False)
    palette = dict(zip(experiment.variants, sns.color_palette("tab10", len(experiment.variants))))
    known = axes[0][0]
    if "goals_known" in experiment.curves:
        _seeds_and_mean(known, experiment, "goals_known", palette)
    known.set_title("goals known (described by the social partner, and the initial set)", fontsize=10)
    known.set_xlabel(X_LABELS["env_steps"])
    if known.lines:
        known.legend(fontsize=8, loc="best")
    axes[0][1].set_visible(False)
    for (share_ax, lp_ax), variant in zip(axes[1:], variants):
        mine = buckets[buckets["variant"] == variant].groupby(["env_steps", "bucket"])[["share", "lp"]].mean()
        for column, ax, what in (("share", share_ax, "share of the goals drawn"), ("lp", lp_ax, "learning progress")):
            table = mine[column].unstack("bucket")
            if not table.notna().any().any():  # `discovered` measures no learning progress
                ax.set_visible(False)
                continue
            table.plot(ax=ax, linewidth=1.5)
            ax.legend(fontsize=7, loc="best", ncol=2)
            ax.set_title(f"{variant}:\n{what} per bucket", fontsize=10)  # two lines: long names overlap
            ax.set_xlabel(X_LABELS["env_steps"])
    fig.suptitle(f"{title} ({experiment.name}): goal sampling, means over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def goal_types_figure() -> plt.Figure:
    """Figure 4: the share of each goal type among the train goals (98% are sequential)."""
    goals = catalog()
    counts = Counter(goals.parse(g).type.value for g in goals.goals("train"))
    table = pd.DataFrame({"goal type": [t.value for t in GoalType], "count": [counts[t.value] for t in GoalType]})
    table["share (%)"] = 100 * table["count"] / table["count"].sum()
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    sns.barplot(table, x="goal type", y="share (%)", ax=ax, color=sns.color_palette("tab10")[0])
    for i, row in table.iterrows():
        ax.text(i, row["share (%)"] + 1, f"{row['count']:,}\n{row['share (%)']:.1f}%", ha="center", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_title(f"Figure 4: goal types among the {table['count'].sum():,} train goals")
    fig.tight_layout()
    return fig


def write_figure(fig: plt.Figure, stem: Path) -> list[Path]:
    """PNG and PDF, each written atomically."""
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        save_figure(fig, path)
    plt.close(fig)
    return paths
