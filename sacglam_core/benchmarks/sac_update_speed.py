"""The SAC update against the reference update (the same mathematics, every LLM pass on its own), side by side.

    python -m sacglam_core.benchmarks.sac_update_speed [--experiment mini --variant SAC-GLAM+HER --steps 1920]
        [--critic-input decoded_action --critic-weights separate --repeats 2]

Two processes train the same configuration at once, one torch thread each: one with `SAC._update`, one with
benchmarks/sac_reference.py's `reference_update` (the update before its passes were shared and skipped).
It prints each one's training throughput (environment steps/s, acting and updates), their ratio, and the
largest relative difference between the two runs' non-timing metrics, which must be float noise.
`--critic-input`/`--critic-weights` override the variant's critic, e.g. the paper's obs_action on shared
weights, or the separate weights the main job used before.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import statistics
import tempfile
from pathlib import Path

from sacglam_core.benchmarks import add_threads_argument
from sacglam_core.benchmarks.compare_revisions import ROOT, largest_difference, run_config
from sacglam_core.pipeline.experiments import merge


def train(settings: dict, reference: bool) -> list[dict[str, str]]:
    import torch

    from sacglam_core.benchmarks.sac_reference import reference_update
    from sacglam_core.config import parse_config
    from sacglam_core.trainer import Trainer

    torch.set_num_threads(settings["threads"])
    trainer = Trainer(parse_config(settings))
    if reference:
        trainer.algo._update = reference_update.__get__(trainer.algo)
    if trainer.run() != 0:
        raise SystemExit(f"error: the {'reference' if reference else 'current'} run did not finish")
    with (Path(settings["output_dir"]) / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="mini")
    parser.add_argument("--variant", default="SAC-GLAM+HER")
    parser.add_argument("--steps", type=int, default=1920)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--critic-input", choices=("obs_action", "obs", "decoded_action"))
    parser.add_argument("--critic-weights", choices=("shared", "shared_frozen", "separate"))
    parser.add_argument("--models", default=str(ROOT / "resources/models"))
    add_threads_argument(parser)
    args = parser.parse_args()
    settings = run_config(args.experiment, args.variant, args.steps, str(Path(args.models).resolve()), args.threads)
    critic = {k: v for k, v in (("input", args.critic_input), ("weights", args.critic_weights)) if v}
    if critic.get("weights") == "separate":
        critic["target_lm"] = True
    settings = merge(settings, {"sac": {"critic": critic}})
    print(
        f"{args.experiment} / {args.variant}, critic {settings['sac'].get('critic')}, {args.steps} steps, "
        f"{args.threads} torch thread(s) per run, both runs at once"
    )
    ratios = []
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, context.Pool(2) as pool:
        for repeat in range(args.repeats):
            jobs = {
                name: pool.apply_async(
                    train, (merge(settings, {"output_dir": f"{tmp}/{name}-{repeat}"}), name == "reference")
                )
                for name in ("reference", "current")
            }
            tables = {name: job.get() for name, job in jobs.items()}
            rates = {name: float(table[-1]["env_steps_per_s"]) for name, table in tables.items()}
            ratios.append(rates["current"] / rates["reference"])
            difference = largest_difference(tables["current"], tables["reference"])
            print(
                f"  repeat {repeat + 1}: reference {rates['reference']:.2f}, current {rates['current']:.2f} "
                f"env steps/s: x{ratios[-1]:.2f}; largest relative difference of the metrics {difference:.1e}",
                flush=True,
            )
    print(f"median ratio x{statistics.median(ratios):.2f} over {len(ratios)} repeats")


if __name__ == "__main__":
    main()
