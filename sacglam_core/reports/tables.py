"""Tables as CSV and Markdown: the per-variant summary, the robust statistics, and the paper's Tables 1-3
(hyperparameters) generated from the configuration the runs actually used."""

from __future__ import annotations

import math
from dataclasses import asdict
from functools import cache
from pathlib import Path

import pandas as pd

from sacglam_core.atomic import write_text
from sacglam_core.config import HOW_KERNELS_RUN, RunConfig, parse_config
from sacglam_core.pipeline.experiments import merge
from sacglam_core.reports.aggregate import (
    GOAL_TYPE_COLUMNS,
    Experiment,
    diagnostics_table,
    robust_table,
    summary_table,
)

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
    ("Value loss", "ppo.value_loss"),
    ("Advantage normalisation per minibatch", "ppo.normalize_advantages"),
]
SAC_TABLE = [  # paper Tables 2 and 3
    ("Update frequency", "sac.update_every"),
    ("Number of updates", "sac.updates_per_cycle"),
    ("Batch size", "sac.batch_size"),
    ("Discount factor", "sac.gamma"),
    ("Optimizer", None),
    ("Critic learning rate", "sac.critic_lr"),
    ("Actor learning rate", "sac.actor_lr"),
    ("Actor learning-rate ramp (updates)", "sac.actor_lr_ramp_updates"),
    ("Actor loss", "sac.actor_loss"),
    ("Entropy coefficient", "sac.autotune_alpha"),
    ("Entropy coefficient initialization", "sac.alpha_init"),
    ("Target entropy", "sac.target_entropy"),
    ("Entropy coefficient learning rate", "sac.alpha_lr"),
    ("n-step", "sac.n_step"),
    ("Replay buffer capacity", "sac.buffer_size"),
    ("Critic warm-up (update cycles)", "sac.warmup_cycles"),
    ("Critic input", "sac.critic.input"),
    ("Critic weights", "sac.critic.weights"),
]
HER_ROWS = [("HER", "her.enabled"), ("HER batch sampling", "her.sampling"), ("HER share per batch", "her.her_fraction")]
COMMON_ROWS = [
    ("Model", "model.name_or_path"),
    ("LoRA rank", "model.lora.r"),
    ("LoRA alpha", "model.lora.alpha"),
    ("LoRA target modules", "model.lora.target_modules"),
    ("4-bit quantization", "model.load_in_4bit"),
    ("Compute dtype", "model.dtype"),
    ("Parallel environments", "num_envs"),
    ("Data-parallel ranks", "ranks"),
    ("Environment steps", "total_steps"),
    ("Objects per scene", "env.n_objects"),
    ("Simplified (simple goals only)", "env.simplified"),
    ("Horizon", "env.max_steps"),
    ("Grasp goals hold", "env.grasp_rule"),
]
# Settings that do not change what a run learns, left out of the comparison with the paper (how kernels run too).
NOT_COMPARED = (
    "output_dir", "seed", "threads", "model.device", "model.cache_dir", "checkpoint.",
    *(f"model.{how}" for how in HOW_KERNELS_RUN),
)  # fmt: skip

# The paper's settings for Figure 2: RunConfig's defaults (Tables 1-3; where the paper is silent, the first
# author's code, else documented choices such as the horizon), the model of section 3 and Appendix C
# (Flan-T5-base, LoRA, 4-bit, on 4 data-parallel ranks: its 4 LLM instances), and per variant Appendix C's entropy
# settings for SAC-GLAM+HER.
PAPER_MODEL = {"model": {"name_or_path": "google/flan-t5-base", "lora": {}, "load_in_4bit": True}, "ranks": 4}
PAPER_VARIANTS = {
    "ppo": {"algorithm": "ppo"},
    "sac": {"algorithm": "sac"},
    "sac_her": {"algorithm": "sac", "her": {"enabled": True}, "sac": {"alpha_init": 0.05, "target_entropy": 0.01}},
}
DIFFERS = "differs from the paper"


@cache
def paper_config(kind: str) -> RunConfig:
    """The paper's run configuration of a variant kind: `ppo`, `sac` or `sac_her`."""
    return parse_config(merge(PAPER_MODEL, PAPER_VARIANTS[kind]), source=f"the paper's {kind} settings")


def kind(config: RunConfig) -> str:
    return "ppo" if config.algorithm == "ppo" else ("sac_her" if config.her.enabled else "sac")


def _get(config: RunConfig, path: str | None):
    """A setting by dotted path, as the trainer resolves it (HER's defaults are HERConfig's properties); `none`
    where it is unset (no LoRA), `n/a` where it does not apply, so that a difference reads in bold."""
    if path is None:
        return "Adam"
    value = config
    for key in path.split("."):
        value = getattr(value, key, None)
        if value is None:
            return "default" if path == "model.lora.target_modules" and config.model.lora else "none"
    if path == "sac.autotune_alpha":
        return "auto" if value else "fixed"
    if path == "her.her_fraction" and config.her.sampling not in ("ratio", "prior_ratio"):
        return "n/a"  # the share only applies to the ratio strategies
    return ", ".join(value) if isinstance(value, tuple) else value


def _as_run(value, path: str | None, summary: dict | None):
    """A cell: the configured value, with what it resolved to in the run when it was `auto`/`default`."""
    resolved = {"model.dtype": "dtype", "model.lora.target_modules": "lora_target_modules"}.get(path or "")
    used = (summary or {}).get(resolved) if resolved else None
    if used is None or value not in ("auto", "default"):
        return value
    return f"{value}: {', '.join(used) if isinstance(used, list) else used}"


def _settings(config: RunConfig) -> dict[str, object]:
    """Every setting by dotted path (a section set to None counts as one setting)."""
    flat: dict[str, object] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}{key}.", inner)
        else:
            flat[prefix[:-1]] = tuple(value) if isinstance(value, list) else value

    walk("", asdict(config))
    return flat


def _other_rows(configs: dict[str, RunConfig], paper: RunConfig, shown: set[str]) -> list[tuple[str, str]]:
    """(row, path) for every remaining setting in which a variant differs from the paper."""
    other = "sac." if paper.algorithm == "ppo" else "ppo."
    mine = {v: _settings(c) for v, c in configs.items()}
    reference = _settings(paper)
    paths = sorted({p for flat in mine.values() for p in flat} | set(reference))
    return [
        (path, path)
        for path in paths
        if path not in shown
        and not path.startswith((other, "model.lora", *NOT_COMPARED))
        and any(flat.get(path) != reference.get(path) for flat in mine.values())
    ]


def hyperparameters(experiment: Experiment) -> pd.DataFrame:
    """Tables 1 (PPO-GLAM), 2 (SAC-GLAM) and 3 (SAC-GLAM+HER) for this experiment's variants, each row with
    the paper's value; the variants that differ from it are named in the last column (and bold in the
    Markdown copy). Rows after the paper's: every other setting in which a variant differs."""
    tables = [
        ("Table 1: PPO-GLAM", "ppo", PPO_TABLE + HER_ROWS[:1]),
        ("Table 2: SAC-GLAM", "sac", SAC_TABLE),
        ("Table 3: SAC-GLAM+HER", "sac_her", SAC_TABLE + HER_ROWS),
    ]
    summaries = {variant: summary for (variant, _), summary in experiment.summaries.items()}
    rows = []
    for table, algorithm, spec in tables:
        configs = {v: c for v, c in experiment.configs.items() if kind(c) == algorithm}
        if not configs:
            continue
        paper = paper_config(algorithm)
        spec = spec + COMMON_ROWS
        shown = {path for _, path in spec} | {"her.strategy", "her.ratio"}  # as HER batch sampling and share
        spec += _other_rows(configs, paper, shown)
        for name, path in spec:
            values = {v: _get(c, path) for v, c in configs.items()}
            row = {"table": table, "parameter": name, "paper": _get(paper, path)}
            row |= {v: _as_run(value, path, summaries.get(v)) for v, value in values.items()}
            rows.append(row | {DIFFERS: ", ".join(v for v, value in values.items() if value != row["paper"])})
    variants = [v for v in experiment.variants if v in experiment.configs]
    return pd.DataFrame(rows, columns=["table", "parameter", "paper", *variants, DIFFERS] if rows else None)


def hyperparameters_markdown(table: pd.DataFrame) -> pd.DataFrame:
    """The table with each setting that differs from the paper in bold."""
    marked = table.astype(object).where(table.notna(), "")  # a variant's column is empty in other tables
    variants = list(table.columns[table.columns.get_loc("paper") + 1 : table.columns.get_loc(DIFFERS)])
    for index, row in table.iterrows():
        for variant in _joined_names(str(row[DIFFERS]), variants) or ():
            marked.at[index, variant] = f"**{row[variant]}**"
    return marked


def _joined_names(text: str, names: list[str]) -> list[str] | None:
    """The names, in their order, whose ", "-join is `text`: a variant's name may hold ", " itself."""
    if not text:
        return []
    for i, name in enumerate(names):
        if text == name:
            return [name]
        if text.startswith(name + ", ") and (rest := _joined_names(text[len(name) + 2 :], names[i + 1 :])) is not None:
            return [name, *rest]
    return None


def _pm(mean: float, std: float, digits: int = 3) -> str:
    if isinstance(mean, float) and math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if isinstance(std, float) and math.isnan(std) else f" ± {std:.{digits}f}")


def _steps(mean: float, std: float, reached: str) -> str:
    if math.isnan(mean):
        return f"not reached (0/{reached.split('/')[1]})"
    return f"{mean:,.0f}" + ("" if math.isnan(std) else f" ± {std:,.0f}") + f" ({reached})"


def summary_markdown(summary: pd.DataFrame) -> pd.DataFrame:
    seeds = [f"{n} ({k} left out)" if k else n for n, k in zip(summary["seeds"], summary["left_out"])]
    out = pd.DataFrame({"variant": summary["variant"], "seeds": seeds})
    out["final success"] = [_pm(m, s) for m, s in zip(summary["final_success_mean"], summary["final_success_std"])]
    errors = zip(summary["final_success_se_mean"], summary["largest_se_mean"])
    out["evaluation SE, final (largest)"] = ["–" if math.isnan(f) else f"{f:.3f} ({g:.3f})" for f, g in errors]
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
    minutes = zip(summary["train_hours_mean"] * 60, summary["train_hours_std"] * 60)
    out["training minutes"] = [_pm(m, s, 2) for m, s in minutes]  # acting and updates, what `claims` compares
    out["GPU-hours per run"] = [_pm(m, s, 1) for m, s in zip(summary["gpu_hours_mean"], summary["gpu_hours_std"])]
    return out


def write_table(table: pd.DataFrame, stem: Path, markdown: pd.DataFrame | None = None, note: str = "") -> list[Path]:
    csv, md = stem.with_suffix(".csv"), stem.with_suffix(".md")
    write_text(csv, table.to_csv(index=False))
    text = (markdown if markdown is not None else table).to_markdown(index=False, floatfmt=".3f")
    write_text(md, (f"{note}\n\n" if note else "") + text + "\n")
    return [csv, md]


def write_tables(experiment: Experiment, out: Path) -> list[Path]:
    summary = summary_table(experiment)
    paths = write_table(summary, out / "summary", summary_markdown(summary), experiment.missing_note())
    iqm, improvement = robust_table(experiment)
    ci = "95% stratified-bootstrap confidence interval"
    paths += write_table(iqm, out / "iqm", note=f"Interquartile mean of the final success per goal type, {ci}")
    note = (
        f"P(final success of x > y), Agarwal et al.'s probability of improvement with goal types as its tasks, {ci}; "
        "`claims` computes another one, P(AUC of x > y) over pairs of seeds"
    )
    paths += write_table(improvement, out / "improvement_per_goal_type", note=note)
    table = hyperparameters(experiment)
    note = (
        "From the runs' config.yaml (and done.json for what `auto` resolved to). Column `paper`: the paper's "
        "Tables 1-3 and Appendix C; where the paper is silent, the first author's code, else this project's "
        f"documented defaults (sacglam_core/config.py). Settings in bold (named in `{DIFFERS}`) differ from it."
    )
    paths += write_table(table, out / "hyperparameters", hyperparameters_markdown(table), note=note)
    note = (
        "Per run, then per variant (seed `mean`). Success: at step 0, the lowest after it, the last. Each diagnostic's "
        "mean over the metrics rows (each the mean of the updates since the previous row) and its last value: "
        "`policy_kl`, KL(pi before an update || pi after it) on the update's states; `entropy` of pi; SAC: "
        "`target_policy_entropy`, the entropy of softmax(Q / alpha), `q_range`, max - min of Q over a state's "
        "candidates, and `alpha`."
    )
    return paths + write_table(diagnostics_table(experiment), out / "diagnostics", note=note)
