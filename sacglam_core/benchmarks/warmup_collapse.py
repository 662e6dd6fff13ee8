"""What breaks the policy around the critic warm-up: short runs of an experiment's SAC variant, side by side.

    python -m sacglam_core.benchmarks.warmup_collapse [--experiment mini --variant SAC-GLAM+HER --steps 1280]

Each probe is the variant with one change (critic learning rate, critic weights), trained for `--steps`
and evaluated every 160 steps, two probes at a time (one torch thread each). It prints the evaluation
success at every evaluation and the policy's entropy in its first actor updates (after the warm-up;
the uniform policy's is about 1.9 nats). During the warm-up only the critic learns, so a policy that
changes before it ends was changed by the critic's gradients through the LM it shares with the actor.
Seed 100 by default: not one of the seeds the main job reports.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from sacglam_core.benchmarks import add_threads_argument
from sacglam_core.benchmarks.compare_revisions import ROOT, run_config
from sacglam_core.pipeline.experiments import merge

PROBES = {
    "shared LM, critic lr 1e-3": {"sac": {"critic_lr": 1e-3, "critic": {"weights": "shared"}}},
    "shared LM, critic lr 1e-4": {"sac": {"critic_lr": 1e-4, "critic": {"weights": "shared"}}},
    "frozen LM, critic lr 1e-3": {"sac": {"critic_lr": 1e-3, "critic": {"weights": "shared_frozen"}}},
    "separate LM, critic lr 1e-3": {"sac": {"critic_lr": 1e-3, "critic": {"weights": "separate", "target_lm": True}}},
}


def probe(settings: dict, out: Path, threads: int) -> list[dict[str, str]]:
    out.mkdir(parents=True)
    (out / "run.yaml").write_text(yaml.safe_dump({**settings, "output_dir": str(out)}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "sacglam_core.train", "--config", str(out / "run.yaml")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: the probe in {out} failed:\n{result.stderr[-2000:]}")
    with (out / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="mini")
    parser.add_argument("--variant", default="SAC-GLAM+HER")
    parser.add_argument("--steps", type=int, default=1280)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--models", default=str(ROOT / "resources/models"))
    add_threads_argument(parser)
    args = parser.parse_args()
    base = run_config(args.experiment, args.variant, args.steps, str(Path(args.models).resolve()), args.threads)
    base = merge(base, {"seed": args.seed, "eval": {"every_steps": 160}})
    print(f"{args.experiment} / {args.variant}, seed {args.seed}, {args.steps} steps, {args.threads} torch thread(s)")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        jobs = {
            name: pool.submit(probe, merge(base, change), Path(tmp) / str(i), args.threads)
            for i, (name, change) in enumerate(PROBES.items())
        }
        for name, job in jobs.items():
            rows = job.result()
            success = " ".join(f"{float(r['eval_success']):.2f}" for r in rows)
            first_actor = next((r for r in rows if r["entropy"] not in ("", None)), None)
            entropy = f"{float(first_actor['entropy']):.2f} at step {first_actor['env_steps']}" if first_actor else "-"
            print(f"  {name:<30} success every 160 steps: {success}; entropy of the first actor updates {entropy}")


if __name__ == "__main__":
    main()
