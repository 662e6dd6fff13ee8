"""fp16 training against fp32 (and bf16): the same short run (seed, environments, LoRA r=16 on the default
modules) in each compute dtype, printing the losses side by side and, for fp16, the GradScaler's final loss
scales (they start at 65536 and halve at every overflow, whose optimizer step is skipped).

    python -m sacglam_core.benchmarks.precision [--model resources/models/tiny-t5] [--steps 512]
    python -m sacglam_core.benchmarks.precision --model <flan-t5-base folder> --device cuda

On a CPU this measures the numerics only (fp16 matmuls are emulated there); speed needs the GPU.
"""

from __future__ import annotations

import argparse
import csv
import math
import tempfile
from pathlib import Path

import torch

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.config import parse_config
from sacglam_core.trainer import Trainer

RUNS = {
    "SAC-GLAM+HER": (
        {"algorithm": "sac", "her": {"enabled": True}, "sac": {"alpha_init": 0.05, "target_entropy": 0.01}},
        ("critic_loss", "actor_loss", "mean_q", "entropy", "eval_success"),
    ),
    "PPO-GLAM": (
        {"algorithm": "ppo", "ppo": {"rollout_steps": 128, "epochs": 4, "minibatch_size": 64}},
        ("policy_loss", "value_loss", "entropy", "eval_success"),
    ),
}
DTYPES = ("float32", "bfloat16", "float16")


def run(name: str, dtype: str, args: argparse.Namespace, out: Path) -> tuple[list[dict], list[float]]:
    """The metrics rows of one run, and the final loss scale of each of its optimizers (fp16 only)."""
    settings, _ = RUNS[name]
    raw = {
        **settings,
        "model": {"name_or_path": args.model, "device": args.device, "dtype": dtype, "lora": {"r": 16}},
        "output_dir": str(out / name / dtype),
        "total_steps": args.steps,
        "num_envs": 32,
        "threads": args.threads,
        "env": {"simplified": True, "n_objects": 3, "max_steps": 8},
        "eval": {"every_steps": args.steps // 4, "episodes_per_type": 32, "test_episodes": 8},
        "checkpoint": {"every_updates": 10**9},
    }
    if settings["algorithm"] == "sac":
        raw["sac"] = {**raw["sac"], "batch_size": 64, "warmup_cycles": 2}
    Trainer(parse_config(raw)).run()
    with (out / name / dtype / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    manifest = sorted((out / name / dtype / "checkpoints").glob("ckpt-*.json"))[-1]
    algo = torch.load(manifest.with_name(f"{manifest.stem}.shared.pt"), weights_only=True)["algo"]
    scalers = algo["scalers"] if "scalers" in algo else [algo["scaler"]]
    return rows, [scaler["scale"] for scaler in scalers if scaler]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/models/tiny-t5")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=512)
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    print(f"compute dtype numerics: {args.model}, {args.device}, {args.steps} steps, LoRA r=16, same seed")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, columns) in RUNS.items():
            results = {dtype: run(name, dtype, args, Path(tmp)) for dtype in DTYPES}
            print(f"\n{name} (fp16 loss scales at the end, per optimizer: {results['float16'][1]})")
            print(f"{'steps':>7} {'metric':<13}" + "".join(f"{d:>11}" for d in DTYPES) + "   |fp16 - fp32|")
            for index, row in enumerate(results["float32"][0]):
                for column in columns:
                    values = [_number(results[d][0][index][column]) for d in DTYPES]
                    gap = abs(values[2] - values[0])
                    cells = "".join(f"{v:>11.4f}" for v in values)
                    print(f"{row['env_steps']:>7} {column:<13}{cells}   {gap:.4f}")


def _number(text: str) -> float:
    return float(text) if text not in ("", "nan") else math.nan


if __name__ == "__main__":
    main()
