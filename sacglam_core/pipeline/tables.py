"""Tables as CSV and Markdown: the per-variant summary, the robust statistics, and the paper's Tables 1-3
(hyperparameters) generated from the configuration the runs actually used."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sacglam_core.atomic import write_text
from sacglam_core.config import RunConfig
from sacglam_core.pipeline.aggregate import GOAL_TYPE_COLUMNS, Experiment, robust_table, summary_table

PPO_TABLE = [  # paper Table 1: (row, config path)
    ("Number of transitions collected between two updates", "ppo.rollout_steps"),
    ("Number of epochs per update", "ppo.epochs"),
    ("Batch size", "ppo.minibatch_size"),
    ("Entropy loss coefficient", "ppo.entropy_coef"),
    ("Value function loss coefficient", "ppo.value_coef"),
    ("Discount factor", "ppo.gamma"),
    ("Optimizer", None),
    ("Learning rate", "ppo.lr"),
    ("λ factor of the Generalized Advantage Estimator", "ppo.gae_lambda"),
    ("Clipping parameter ε", "ppo.clip"),
    ("Maximum gradient norm", "ppo.max_grad_norm"),
    ("Loss", "ppo.loss"),
]
SAC_TABLE = [  # paper Tables 2 and 3
    ("Update frequency", "sac.update_every"),
    ("Number of updates", "sac.updates_per_cycle"),
    ("Batch size", "sac.batch_size"),
    ("Discount factor", "sac.gamma"),
    ("Optimizer", None),
    ("Critic learning rate", "sac.critic_lr"),
    ("Actor learning rate", "sac.actor_lr"),
    ("Entropy coefficient", "sac.autotune_alpha"),
    ("Entropy coefficient initialization", "sac.alpha_init"),
    ("Target entropy", "sac.target_entropy"),
    ("Entropy coefficient learning rate", "sac.alpha_lr"),
    ("n-step", "sac.n_step"),
    ("Replay buffer capacity", "sac.buffer_size"),
    ("Critic input", "sac.critic.input"),
    ("Critic weights", "sac.critic.weights"),
]
HER_ROWS = [("HER", "her.enabled"), ("HER batch sampling", "her.sampling"), ("HER share per batch", "her.her_fraction")]
COMMON_ROWS = [
    ("Model", "model.name_or_path"),
    ("LoRA rank", "model.lora.r"),
    ("4-bit quantization", "model.load_in_4bit"),
    ("Parallel environments", "num_envs"),
    ("Environment steps", "total_steps"),
    ("Objects per scene", "env.n_objects"),
    ("Simplified (simple goals only)", "env.simplified"),
    ("Horizon", "env.max_steps"),
]


def _get(config: RunConfig, path: str | None):
    """A setting by dotted path, as the trainer resolves it (HER's defaults are HERConfig's properties)."""
    if path is None:
        return "Adam"
    value = config
    for key in path.split("."):
        value = getattr(value, key, None)
        if value is None:
            return ""
    if path == "sac.autotune_alpha":
        return "auto" if value else "fixed"
    if path == "her.her_fraction" and config.her.sampling not in ("ratio", "prior_ratio"):
        return ""  # the share only applies to the ratio strategies
    return value


def hyperparameters(experiment: Experiment) -> pd.DataFrame:
    """Tables 1 (PPO-GLAM), 2 (SAC-GLAM) and 3 (SAC-GLAM+HER) for this experiment's variants."""

    def kind(config: RunConfig) -> str:
        return "ppo" if config.algorithm == "ppo" else ("sac_her" if config.her.enabled else "sac")

    tables = [
        ("Table 1: PPO-GLAM", "ppo", PPO_TABLE + HER_ROWS[:1]),
        ("Table 2: SAC-GLAM", "sac", SAC_TABLE),
        ("Table 3: SAC-GLAM+HER", "sac_her", SAC_TABLE + HER_ROWS),
    ]
    rows = []
    for table, algorithm, spec in tables:
        variants = [v for v, c in experiment.configs.items() if kind(c) == algorithm]
        for name, path in (spec + COMMON_ROWS) if variants else []:
            rows.append({"table": table, "parameter": name, **{v: _get(experiment.configs[v], path) for v in variants}})
    return pd.DataFrame(rows)


def _pm(mean: float, std: float, digits: int = 3) -> str:
    if isinstance(mean, float) and math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if isinstance(std, float) and math.isnan(std) else f" ± {std:.{digits}f}")


def _steps(mean: float, std: float, reached: str) -> str:
    if math.isnan(mean):
        return f"not reached (0/{reached.split('/')[1]})"
    return f"{mean:,.0f}" + ("" if math.isnan(std) else f" ± {std:,.0f}") + f" ({reached})"


def summary_markdown(summary: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"variant": summary["variant"], "seeds": summary["seeds"]})
    out["final success"] = [_pm(m, s) for m, s in zip(summary["final_success_mean"], summary["final_success_std"])]
    out["AUC"] = [_pm(m, s) for m, s in zip(summary["auc_mean"], summary["auc_std"])]
    for t in (50, 80):
        cols = summary[f"steps_to_{t}_mean"], summary[f"steps_to_{t}_std"], summary[f"steps_to_{t}_reached"]
        out[f"steps to {t}%"] = [_steps(m, s, r) for m, s, r in zip(*cols)]
    for goal_type, metric in GOAL_TYPE_COLUMNS.items():
        column = metric.removeprefix("eval_")
        if summary[f"{column}_mean"].notna().any():
            out[goal_type.value] = [_pm(m, s) for m, s in zip(summary[f"{column}_mean"], summary[f"{column}_std"])]
    out["test split"] = [_pm(m, s) for m, s in zip(summary["test_success_mean"], summary["test_success_std"])]
    out["env steps/s"] = [_pm(m, s, 1) for m, s in zip(summary["env_steps_per_s_mean"], summary["env_steps_per_s_std"])]
    out["GPU-hours per run"] = [_pm(m, s, 1) for m, s in zip(summary["gpu_hours_mean"], summary["gpu_hours_std"])]
    return out


def write_table(table: pd.DataFrame, stem: Path, markdown: pd.DataFrame | None = None, note: str = "") -> list[Path]:
    csv, md = stem.with_suffix(".csv"), stem.with_suffix(".md")
    write_text(csv, table.to_csv(index=False))
    text = (markdown if markdown is not None else table).to_markdown(index=False, floatfmt=".3f")
    write_text(md, (f"{note}\n\n" if note else "") + text + "\n")
    return [csv, md]


def write_tables(experiment: Experiment, out: Path) -> list[Path]:
    missing = experiment.missing()
    note = "" if not missing else "Missing seeds: " + "; ".join(f"{v}: {s}" for v, s in missing.items())
    summary = summary_table(experiment)
    paths = write_table(summary, out / "summary", summary_markdown(summary), note)
    iqm, improvement = robust_table(experiment)
    ci = "95% stratified-bootstrap confidence interval"
    paths += write_table(iqm, out / "iqm", note=f"Interquartile mean of the final success per goal type, {ci}")
    paths += write_table(improvement, out / "probability_of_improvement", note=f"P(x > y) over goal types, {ci}")
    paths += write_table(hyperparameters(experiment), out / "hyperparameters", note="From the runs' config.yaml")
    return paths
