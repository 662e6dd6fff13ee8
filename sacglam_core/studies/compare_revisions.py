"""Training throughput of this tree against another git revision, side by side in one run.

    python -m sacglam_core.studies.compare_revisions --baseline 96d29ca \
        [--experiment mini --variant SAC-GLAM+HER --steps 1920 --repeats 3 --settings this|baseline|each]

The run configuration comes from this tree's experiment definitions (evaluation and checkpoints pushed
past the end, one torch thread), or with `--settings baseline` from the baseline's: both trees then train
the same settings, so the ratio is the code's alone. With `--settings each`, each tree trains its own
definition of the variant (the experiment as that revision ran it: settings and code together), and the
metrics are not compared. The baseline is checked out in a temporary git worktree, and each
repeat trains the same configuration with both trees at once, one process per core, so that both see
the same machine. It prints each tree's training throughput (environment steps per second of the run,
acting and updates, as the trainer reports it), their ratio, and whether the two runs' non-timing
metrics agree: the same seed must give the same numbers whichever tree trains it.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from sacglam_core.benchmarks import add_threads_argument
from sacglam_core.metrics import TIMING_COLUMNS
from sacglam_core.pipeline.experiments import expand, load_definitions

ROOT = Path(__file__).resolve().parents[2]


def run_config(experiment: str, variant: str, steps: int, models: str, threads: int, tree: Path = ROOT) -> dict:
    definitions = load_definitions(tree / "workflow/config/experiments.yaml")
    for spec in definitions["experiments"].values():
        spec.pop("claims", None)  # an older revision's claims may follow an older schema; runs do not read them
    runs = expand(definitions, [experiment], "unused", {"models": models})
    matching = [r for r in runs if r.variant == variant]
    if not matching:
        raise SystemExit(f"error: {experiment!r} has no variant {variant!r}: {sorted({r.variant for r in runs})}")
    settings = dict(matching[0].settings)
    settings.update(total_steps=steps, threads=threads)
    settings["eval"] = {**settings.get("eval", {}), "every_steps": 10**9}
    settings["checkpoint"] = {**settings.get("checkpoint", {}), "every_updates": 10**9}
    return settings


def metrics(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def largest_difference(a: list[dict], b: list[dict]) -> float:
    """The largest relative difference between two runs' non-timing metrics (inf if their rows differ)."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        for column in x.keys() - set(TIMING_COLUMNS):
            u, v = float(x[column] or "nan"), float(y.get(column) or "nan")
            if math.isnan(u) and math.isnan(v):
                continue
            worst = max(worst, abs(u - v) / max(abs(u), abs(v), 1e-12))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="a git revision of this repository")
    parser.add_argument("--experiment", default="mini")
    parser.add_argument("--variant", default="SAC-GLAM+HER")
    parser.add_argument("--steps", type=int, default=1920)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=str(ROOT / "resources/models"))
    parser.add_argument(
        "--settings", choices=("this", "baseline", "each"), default="this", help="whose experiment definitions"
    )
    add_threads_argument(parser)
    args = parser.parse_args()
    models = str(Path(args.models).resolve())
    print(
        f"{args.experiment} / {args.variant}, {args.steps} steps, {args.threads} torch thread(s) per run, "
        f"both runs at once; baseline {args.baseline}; settings of "
        f"{ {'this': 'this tree', 'baseline': 'the baseline', 'each': 'each tree'}[args.settings] }"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        baseline = tmp / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline), args.baseline],
                       check=True, capture_output=True)  # fmt: skip
        try:
            trees = {"baseline": baseline, "this tree": ROOT}
            configs = {}
            for name, tree in trees.items():
                settings = run_config(
                    args.experiment,
                    args.variant,
                    args.steps,
                    models,
                    args.threads,
                    {"this": ROOT, "baseline": baseline, "each": tree}[args.settings],
                )
                configs[name] = tmp / f"{name.replace(' ', '-')}.yaml"
                configs[name].write_text(yaml.safe_dump(settings))
            ratios = []
            for repeat in range(args.repeats):
                processes = {}
                for name, tree in trees.items():
                    out = tmp / f"{name.replace(' ', '-')}-{repeat}"
                    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
                    command = [
                        sys.executable,
                        "-m",
                        "sacglam_core.train",
                        "--config",
                        str(configs[name]),
                        "--output-dir",
                        str(out),
                    ]
                    processes[name] = (
                        subprocess.Popen(command, cwd=tree, env=env, stderr=subprocess.PIPE, text=True),
                        out,
                    )
                rates, tables = {}, {}
                for name, (process, out) in processes.items():
                    _, stderr = process.communicate()
                    if process.returncode != 0:
                        raise SystemExit(f"error: the {name} run failed:\n{stderr[-2000:]}")
                    tables[name] = metrics(out)
                    rates[name] = float(tables[name][-1]["env_steps_per_s"])
                ratio = rates["this tree"] / rates["baseline"]
                ratios.append(ratio)
                agreement = "metrics not compared (different settings)"
                if args.settings != "each":
                    difference = largest_difference(tables["this tree"], tables["baseline"])
                    agreement = f"largest relative difference of the metrics {difference:.1e}"
                print(
                    f"  repeat {repeat + 1}: baseline {rates['baseline']:.2f}, this tree {rates['this tree']:.2f} "
                    f"env steps/s: x{ratio:.2f}; {agreement}",
                    flush=True,
                )
            print(f"median ratio x{statistics.median(ratios):.2f} over {len(ratios)} repeats")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)


if __name__ == "__main__":
    main()
