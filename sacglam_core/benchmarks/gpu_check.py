"""A one-command check of a CUDA machine at the paper's scale, in about 9 minutes on an H100.

    python -m sacglam_core.benchmarks.gpu_check [--steps 520]
    python -m sacglam_core.benchmarks.gpu_check --device cpu --model resources/models/tiny-t5 --steps 64 --small

On a Flan-T5-base-shaped model (random weights, built here: no Hub) with LoRA and 4-bit weights, in the
dtype that `model.dtype: auto` picks for this GPU and in the other half-precision dtype:
- scoring: the policy over the candidates of 32 environments, prompts/s and actions/s;
- `--steps` environment steps of SAC-GLAM+HER and of PPO-GLAM with the paper's settings for one of its
  4 ranks (8 environments; SAC: 2 updates of 64 every 8 steps; PPO: 512 steps, 16 epochs of 64),
  evaluation and checkpoints off: environment steps/s, updates/s, peak GPU memory, and the achieved
  TFLOP/s, from the FLOPs that benchmarks/step_cost.py counts for the same settings;
- that the LoRA weights changed and every loss is finite (exit status 1 if not).
`--device cpu` runs the same logic on a CPU, with a tiny model, for tests; `--small` shrinks PPO's rollout
to 64 steps of 2 epochs there (4-bit weights compute slowly on a CPU).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.benchmarks.step_cost import counting_agent, masks_without_values, random_play, step_cost
from sacglam_core.config import RunConfig, parse_config
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.models.loading import load_tokenizer, resolve_dtype
from sacglam_core.models.shapes import save_flan_t5_base_shaped
from sacglam_core.trainer import Trainer

PER_RANK = {  # the paper's run (Tables 1-3, 32 environments, global batch 256) seen from one of 4 ranks
    "SAC-GLAM+HER": {
        "algorithm": "sac",
        "her": {"enabled": True},
        "sac": {
            "update_every": 8,
            "updates_per_cycle": 2,
            "batch_size": 64,
            "alpha_init": 0.05,
            "target_entropy": 0.01,
        },
    },
    "PPO-GLAM": {"algorithm": "ppo", "ppo": {"rollout_steps": 512, "epochs": 16, "minibatch_size": 64}},
}
SMALL = {"ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32}}  # --small: PPO updates within 64 steps
LOSSES = ("critic_loss", "actor_loss", "policy_loss", "value_loss")


def run_config(
    variant: str, model: Path, device: str, dtype: str, steps: int, out: Path, small: bool = False
) -> RunConfig:
    return parse_config(
        {
            **PER_RANK[variant],
            **(SMALL if small and variant == "PPO-GLAM" else {}),
            "model": {"name_or_path": str(model), "device": device, "dtype": dtype, "lora": {}, "load_in_4bit": True},
            "output_dir": str(out),
            "num_envs": 8,
            "total_steps": steps,
            "threads": torch.get_num_threads(),
            "eval": {"every_steps": 10**9, "episodes_per_type": 1, "test_episodes": 1},
            "checkpoint": {"every_updates": 10**9},
        }
    )


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def scoring(config: RunConfig, repeats: int = 10) -> str:
    agent = GlamAgent.from_config(AgentConfig(config.model), ACTION_VOCABULARY)
    play = random_play(PromptTokens(agent.lm.tokenizer), vector_steps=3)
    prompts, candidates = play.snapshots[0]
    ids = [agent.tokens.action(a) for a in ACTION_VOCABULARY]
    batch = agent.batch_from_ids(prompts, [[ids[a] for a in c] for c in candidates], candidates)
    with torch.no_grad():
        agent.policy(batch)
        synchronize(config.model.device)
        start = time.perf_counter()
        for _ in range(repeats):
            agent.policy(batch)
        synchronize(config.model.device)
    seconds = (time.perf_counter() - start) / repeats
    actions = len(batch.action_tokens)
    return f"{len(prompts) / seconds:,.0f} prompts/s, {actions / seconds:,.0f} actions/s"


def train(config: RunConfig, flops_per_step: float) -> tuple[dict[str, str], list[str]]:
    """One short run: its figures, and the checks that failed."""
    if config.model.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config)
    lora = [p.detach().clone() for p in trainer.agent.lm.parameters_of()]
    if trainer.run() != 0:
        return {}, ["the run did not finish"]
    with (Path(config.output_dir) / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    seconds = float(last["train_seconds"])
    figures = {
        "env steps/s": f"{float(last['env_steps_per_s']):.1f}",
        "updates/s": f"{float(last['updates_per_s']):.2f}",
        "peak memory": (
            f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if config.model.device.startswith("cuda") else "-"
        ),
        "achieved TFLOP/s": f"{flops_per_step * config.total_steps / seconds / 1e12:.2f}",
    }
    failed = []
    if not any((a != b.detach()).any() for a, b in zip(lora, trainer.agent.lm.parameters_of())):
        failed.append("the LoRA weights did not change")
    for loss in LOSSES:
        if last.get(loss) not in (None, "") and not math.isfinite(float(last[loss])):
            failed.append(f"{loss} is {last[loss]}")
    return figures, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", type=Path, help="a model folder (default: a Flan-T5-base-shaped one, built here)")
    parser.add_argument(
        "--steps", type=positive, default=520, help="environment steps of each run (more than PPO's rollout)"
    )
    parser.add_argument("--small", action="store_true", help="PPO: 64-step rollouts of 2 epochs (CPU tests)")
    add_threads_argument(parser)
    args = parser.parse_args()
    rollout = (SMALL if args.small else PER_RANK["PPO-GLAM"])["ppo"]["rollout_steps"]
    if args.steps <= rollout:  # PPO would never update, and its LoRA check would fail for that reason alone
        parser.error(f"--steps must exceed PPO's rollout of {rollout} steps, so that PPO updates at least once")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device here; `--device cpu --model <tiny model>` checks the logic on a CPU")
    pin_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_flan_t5_base_shaped(Path(tmp) / "flan-t5-base-shaped")
        probe = run_config("PPO-GLAM", model, args.device, "auto", args.steps, Path(tmp))
        auto = resolve_dtype(probe.model)
        other = "float16" if auto == "bfloat16" else "bfloat16"
        name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
        print(f"gpu_check: {name}, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), model {model}")
        print(f"dtype auto picks {auto}; also checked: {other}")
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model)
        failures = []
        for dtype in (auto, other):
            print(f"\n## {dtype}{' (auto)' if dtype == auto else ''}")
            print(
                f"scoring, 32 environments: {scoring(run_config('PPO-GLAM', model, args.device, dtype, 1, Path(tmp)))}"
            )
            print("| variant | env steps/s | updates/s | peak memory | achieved TFLOP/s | GFLOP/step | checks |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for variant in PER_RANK:
                out = Path(tmp) / f"{dtype}-{variant}"
                config = run_config(variant, model, args.device, dtype, args.steps, out, args.small)
                play = random_play(PromptTokens(load_tokenizer(config.model)), vector_steps=60, num_envs=8)
                with masks_without_values():
                    cost = step_cost(counting_agent(config, hf_config), config, play, ranks=1, batches=2)
                flops = cost.total - cost.parts["evaluation"]  # the runs do not evaluate
                figures, failed = train(config, flops)
                failures += [f"{dtype} {variant}: {f}" for f in failed]
                columns = ("env steps/s", "updates/s", "peak memory", "achieved TFLOP/s")
                cells = " | ".join(figures.get(k, "-") for k in columns)
                checks = "; ".join(failed) or "LoRA trained, losses finite"
                print(f"| {variant} | {cells} | {flops / 1e9:.1f} | {checks} |")
    print("\nFAILED: " + "; ".join(failures) if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
