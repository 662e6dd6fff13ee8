"""Training throughput per algorithm: environment steps per second of short runs with the paper's
hyperparameters (Tables 1-3), evaluation off, on the tiny model or a given one.

    python -m sacglam_core.benchmarks.train_throughput [--model resources/models/tiny-t5] [--steps 1024]
    python -m sacglam_core.benchmarks.train_throughput --model <flan-t5-base folder> --device cuda --dtype bfloat16

PPO runs two rollouts of 2048 steps (its update comes every 2048 steps), so its figure includes updates.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.config import parse_config
from sacglam_core.trainer import Trainer

VARIANTS = {
    "PPO-GLAM": {"algorithm": "ppo"},
    "SAC-GLAM": {"algorithm": "sac"},
    "SAC-GLAM+HER": {"algorithm": "sac", "her": {"enabled": True}, "sac": {"alpha_init": 0.05, "target_entropy": 0.01}},
}


def measure(
    name: str, settings: dict, model: dict, steps: int, simplified: bool, out: Path, threads: int
) -> tuple[float, float, int]:
    """Environment steps/s, wall seconds and gradient updates of one short run."""
    raw = {
        **settings,
        "model": model,
        "output_dir": str(out / name),
        "threads": threads,
        "total_steps": 2 * 2048 if settings["algorithm"] == "ppo" else steps,
        "env": {"simplified": simplified, "n_objects": 3 if simplified else 6},
        "eval": {"every_steps": 10**9, "episodes_per_type": 1, "test_episodes": 1},
        "checkpoint": {"every_updates": 10**9},
    }
    start = time.perf_counter()
    Trainer(parse_config(raw)).run()
    wall = time.perf_counter() - start
    with (out / name / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    return float(last["env_steps_per_s"]), wall, int(float(last["updates"] or 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/models/tiny-t5")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=1024, help="environment steps of each SAC run")
    parser.add_argument("--simplified", action="store_true")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), help="variants to run (default: all)")
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    model = {"name_or_path": args.model, "device": args.device, "dtype": args.dtype}
    env = "simplified (N=3)" if args.simplified else "full (N=6)"
    print(f"training throughput: {args.model}, {args.device}, {args.dtype}, {env} environment, 32 environments")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or VARIANTS:
            rate, wall, updates = measure(
                name, VARIANTS[name], model, args.steps, args.simplified, Path(tmp), args.threads
            )
            # SAC updates start once finished episodes fill a batch: too few steps measure acting alone.
            print(f"  {name:<14}{rate:>9.1f} env steps/s   ({updates} updates, {wall:.0f} s wall)", flush=True)


if __name__ == "__main__":
    main()
