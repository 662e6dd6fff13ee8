"""What breaks the policy around the critic warm-up: short runs of an experiment's SAC variant, side by side.

    python -m sacglam_core.benchmarks.warmup_collapse [--experiment mini --variant SAC-GLAM+HER --steps 1280]
    python -m sacglam_core.benchmarks.warmup_collapse --probes alpha --experiment mini_sparse --steps 1536 \\
        --seeds 100 104 106 107

Each probe is the variant with one change, trained for `--steps` on each seed and evaluated every
`--every` steps, two runs at a time (one torch thread each). `--probes critic` changes the critic's
learning rate and weights; `--probes alpha` the entropy coefficient's start and learning rate; `--probes
actor_loss` the actor's loss (the paper's reverse KL to softmax(Q / alpha), or the forward KL) at two of the
coefficient's learning rates.

For each run it prints the evaluation success at every evaluation, the policy's entropy in its first
actor updates (after the warm-up; the uniform policy's is about 1.9 nats), and the lowest entropy after
them next to the entropy of the policy the actor's loss pulls towards, softmax(Q / alpha) on the same
states. During the warm-up only the critic learns, so a policy that changes before it ends was changed by
the critic's gradients through the LM it shares with the actor. A policy far more peaked than its target
was made so by the actor's own steps, not asked for by the critic. Seeds 100 and up by default: not the
seeds the main job reports.
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
    "critic": {
        "shared LM, critic lr 1e-3": {"sac": {"critic_lr": 1e-3, "critic": {"weights": "shared"}}},
        "shared LM, critic lr 1e-4": {"sac": {"critic_lr": 1e-4, "critic": {"weights": "shared"}}},
        "frozen LM, critic lr 1e-3": {"sac": {"critic_lr": 1e-3, "critic": {"weights": "shared_frozen"}}},
        "separate LM, critic lr 1e-3": {
            "sac": {"critic_lr": 1e-3, "critic": {"weights": "separate", "target_lm": True}}
        },
    },
    "alpha": {
        "alpha 0.05, lr 2e-3": {"sac": {"alpha_init": 0.05, "alpha_lr": 2e-3}},
        "alpha 0.05, lr 2e-2": {"sac": {"alpha_init": 0.05, "alpha_lr": 2e-2}},
        "alpha 0.05, lr 2e-2, target 0.8": {"sac": {"alpha_init": 0.05, "alpha_lr": 2e-2, "target_entropy": 0.8}},
        "alpha 0.2, lr 2e-2": {"sac": {"alpha_init": 0.2, "alpha_lr": 2e-2}},
    },
    "actor_loss": {
        "reverse KL (paper), alpha lr 2e-3": {"sac": {"actor_loss": "reverse_kl", "alpha_lr": 2e-3}},
        "forward KL, alpha lr 2e-3": {"sac": {"actor_loss": "forward_kl", "alpha_lr": 2e-3}},
        "reverse KL (paper), alpha lr 2e-2": {"sac": {"actor_loss": "reverse_kl", "alpha_lr": 2e-2}},
        "forward KL, alpha lr 2e-2": {"sac": {"actor_loss": "forward_kl", "alpha_lr": 2e-2}},
    },
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


def summary(rows: list[dict[str, str]]) -> str:
    """Success at every evaluation; the policy's entropy first and at its lowest, next to its target's."""
    success = " ".join(f"{float(r['eval_success']):.2f}" for r in rows)
    actor = [r for r in rows if r["entropy"] not in ("", None)]
    if not actor:
        return f"success {success}; no actor update"
    lowest = min(actor, key=lambda r: float(r["entropy"]))
    return (
        f"success {success}; entropy first {float(actor[0]['entropy']):.2f} at step {actor[0]['env_steps']},"
        f" lowest {float(lowest['entropy']):.2f} (its target's {float(lowest['target_policy_entropy']):.2f})"
        f" at step {lowest['env_steps']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="mini")
    parser.add_argument("--variant", default="SAC-GLAM+HER")
    parser.add_argument("--probes", choices=sorted(PROBES), default="critic")
    parser.add_argument("--steps", type=int, default=1280)
    parser.add_argument("--every", type=int, default=160, help="environment steps between evaluations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100])
    parser.add_argument("--models", default=str(ROOT / "resources/models"))
    add_threads_argument(parser)
    args = parser.parse_args()
    base = run_config(args.experiment, args.variant, args.steps, str(Path(args.models).resolve()), args.threads)
    base = merge(base, {"eval": {"every_steps": args.every}})
    print(
        f"{args.experiment} / {args.variant}, seeds {' '.join(map(str, args.seeds))}, {args.steps} steps,"
        f" evaluated every {args.every}, {args.threads} torch thread(s)"
    )
    probes = PROBES[args.probes]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        jobs = {
            (name, seed): pool.submit(
                probe, merge(base, change | {"seed": seed}), Path(tmp) / f"{i}-{seed}", args.threads
            )
            for i, (name, change) in enumerate(probes.items())
            for seed in args.seeds
        }
        for (name, seed), job in jobs.items():
            print(f"  {name:<32} seed {seed}: {summary(job.result())}", flush=True)


if __name__ == "__main__":
    main()
