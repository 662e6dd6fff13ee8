"""How much of an update's LLM input is padding: the share of real tokens in each padded layout the scorer
builds, on batches of a random policy's states. What is not real is the most that bucketing or packing by
length could save.

    python -m sacglam_core.benchmarks.padding [--experiment mini] [--batches 200]

Without `--experiment`, step_cost's Flan-T5-base setting: the project's word-level tokenizer, the full goal set
and 64 transitions per rank. With one, its first SAC variant's tokenizer, environment and batch size. Layouts
(agent/lm.py):
  prompts        [B, longest prompt]                     the prompts' pass (the policy and every critic input)
  actions        [A, longest action]                     the actions' pass with a copy of the prompt per action
  action slots   [B, most candidates x longest action]   a causal LM's actions beside their prompt (shared_prompt.py)
  prompt+action  [A, longest prompt + action]            the paper's obs-action critic: one sequence per candidate
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from sacglam_core.agent.batch import collate, pad_rows
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.benchmarks.step_cost import random_play
from sacglam_core.config import parse_config
from sacglam_core.envs import EnvConfig
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.models.loading import ModelNotFoundError, load_tokenizer, resolve_architecture
from sacglam_core.models.tokenizer import build_tokenizer
from sacglam_core.pipeline.experiments import ExperimentError, expand, load_definitions

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = ("prompts", "actions", "action slots", "prompt+action")


def setting(experiment: str | None, models: str):
    """(tokenizer, environment, transitions per batch, whether prompts are padded on the left)."""
    if experiment is None:
        return build_tokenizer(add_eos=True), EnvConfig(), 64, False
    definitions = load_definitions(ROOT / "workflow/config/experiments.yaml")
    runs = expand(definitions, [experiment], "unused", {"models": models})
    sac = [r for r in runs if r.settings.get("algorithm") == "sac"]
    if not sac:
        raise SystemExit(f"error: {experiment!r} has no SAC variant")
    config = parse_config(sac[0].settings)
    tokenizer = load_tokenizer(config.model)
    return tokenizer, config.env, config.sac.batch_size, resolve_architecture(config.model) == "causal"


def real_shares(prompts, candidates, left: bool) -> dict[str, tuple[int, int]]:
    """(real tokens, padded size) of each layout for one batch (the pad token's id changes neither)."""
    batch = collate(prompts, candidates, 0, left_pad_prompts=left)
    width = batch.action_ids.shape[1]
    rows = [batch.prompt_tokens[i] + a for i, a in zip(batch.owners(), batch.action_tokens)]
    _, concat_mask = pad_rows(rows, 0, left=left)
    actions = int(batch.action_mask.sum())
    return {
        "prompts": (int(batch.prompt_mask.sum()), batch.prompt_mask.numel()),
        "actions": (actions, batch.action_mask.numel()),
        "action slots": (actions, batch.num_prompts * batch.max_candidates * width),
        "prompt+action": (int(concat_mask.sum()), concat_mask.numel()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", help="an experiment of workflow/config/experiments.yaml (default: step_cost's)")
    parser.add_argument("--batches", type=positive, default=200)
    parser.add_argument("--steps", type=positive, default=400, help="vector steps of random play")
    parser.add_argument("--models", default=str(ROOT / "resources/models"))
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    try:
        tokenizer, env, batch_size, left = setting(args.experiment, str(Path(args.models).resolve()))
    except (ExperimentError, ModelNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    tokens = PromptTokens(tokenizer)
    play = random_play(tokens, args.steps, env=env)
    states = [(p, c) for prompts, candidates in play.snapshots for p, c in zip(prompts, candidates)]
    vocabulary = tokens.actions(list(ACTION_VOCABULARY))
    rng = np.random.default_rng(0)
    totals = {layout: np.zeros(2) for layout in LAYOUTS}
    for _ in range(args.batches):
        picked = [states[i] for i in rng.choice(len(states), batch_size, replace=False)]
        shares = real_shares([p for p, _ in picked], [[vocabulary[k] for k in c] for _, c in picked], left)
        for layout, counts in shares.items():
            totals[layout] += counts
    lengths = [len(p) for p, _ in states]
    print(
        f"{args.experiment or 'Flan-T5-base shape (word-level tokens, full goal set)'}: {args.batches} batches of "
        f"{batch_size} from {len(states)} random-policy states; prompts {min(lengths)}-{max(lengths)} tokens, "
        f"mean {np.mean(lengths):.1f}"
    )
    for layout, (real, padded) in totals.items():
        print(f"  {layout:<14} {real / padded:6.1%} real tokens, {1 - real / padded:6.1%} padding")


if __name__ == "__main__":
    main()
