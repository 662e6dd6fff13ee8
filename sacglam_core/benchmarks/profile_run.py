"""Where a training run's time goes: the run under cProfile, its self time grouped by component.

    python -m sacglam_core.benchmarks.profile_run [--experiment mini --variant SAC-GLAM+HER] [--steps 2048] [--ops 12]

"model" is the time inside torch, transformers and peft (forward and backward passes, optimizer
steps), with the tensor operations of the GLAM scorer, heads and losses; everything else (environment,
replay buffer and trajectories, token ids and batching, the agent's and algorithms' own Python,
evaluation bookkeeping, logging and checkpoints) is overhead around the model. A builtin's time (a
torch kernel called from Python, say) counts for the component of the function that called it.
cProfile slows Python code more than torch kernels, so the overhead share it reports is an upper bound.

`--ops N` then runs one more SAC update cycle on the run's replay buffer under torch.profiler and lists the N
torch operators with the most self time: whether the LLM passes are bound by their matrix products or by what
surrounds them (the key/value cache's copies, padding, small kernels), and the matrix products' GFLOP/s
against one large float32 product's on the same threads.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
import torch.utils.benchmark
from torch.utils.flop_counter import FlopCounterMode

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.config import parse_config
from sacglam_core.pipeline.experiments import expand, load_definitions
from sacglam_core.trainer import Trainer

MODEL = "model (torch, transformers, peft)"
MODEL_SIDE = (
    "sacglam_core/agent/lm.py",
    "sacglam_core/agent/policy.py",
    "sacglam_core/agent/critic.py",
    "sacglam_core/algos/",
)
COMPONENTS = [  # (component, substrings of a function's file or name), first match wins
    (MODEL, ("/torch/", "/transformers/", "/peft/", "'run_backward'")),
    ("environment", ("sacglam_core/envs/",)),
    ("replay buffer and trajectories", ("sacglam_core/replay.py", "sacglam_core/trajectories.py")),
    ("token ids and batching", ("sacglam_core/agent/tokens.py", "sacglam_core/agent/batch.py", "/tokenizers/")),
    ("agent and algorithms (Python)", ("sacglam_core/agent/", "sacglam_core/algos/")),
    ("evaluation bookkeeping", ("sacglam_core/evaluation.py",)),
    (
        "logging and checkpoints",
        ("sacglam_core/metrics.py", "sacglam_core/checkpoint.py", "sacglam_core/monitor.py", "/tensorboard/", "/yaml/"),
    ),
    ("numpy", ("/numpy/",)),
]


def component(filename: str, name: str) -> str:
    where = f"{filename} {name}"
    for label, needles in COMPONENTS:
        if any(n in where for n in needles):
            return label
    return "other Python"


def owner(function: tuple, callers: dict) -> list[tuple[str, float | None]]:
    """(component, seconds) shares of a function's self time. A builtin's time goes to its callers'
    components, and to the model when called from the GLAM scorer, heads or losses (MODEL_SIDE)."""
    filename, _, name = function
    if filename != "~" or not callers:
        return [(component(filename, name), None)]
    shares = []
    for (caller_file, _, caller_name), (_, _, tottime, _) in callers.items():
        label = component(caller_file, caller_name)
        if any(part in caller_file for part in MODEL_SIDE):
            label = MODEL
        shares.append((label if caller_file != "~" else component(filename, name), tottime))
    return shares


def breakdown(stats: pstats.Stats) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """Self time per component (seconds), and the functions outside the model with their self time."""
    totals: dict[str, float] = defaultdict(float)
    outside = []
    for function, (_, _, tottime, _, callers) in stats.stats.items():
        for label, seconds in owner(function, callers):
            seconds = tottime if seconds is None else seconds
            totals[label] += seconds
            if label != MODEL:
                outside.append((seconds, f"{Path(function[0]).name}:{function[1]}({function[2]}) [{label}]"))
    return dict(totals), outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", default="workflow/config/experiments.yaml")
    parser.add_argument("--experiment", default="mini")
    parser.add_argument("--variant", default="SAC-GLAM+HER")
    parser.add_argument("--models", default="resources/models")
    parser.add_argument("--steps", type=int, default=None, help="environment steps (default: the experiment's)")
    parser.add_argument("--top", type=int, default=12, help="also list the slowest functions outside the model")
    parser.add_argument("--ops", type=int, default=0, help="then list the torch operators of one SAC update cycle")
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    runs = expand(load_definitions(args.experiments), [args.experiment], "unused", {"models": args.models})
    run = next(r for r in runs if r.variant == args.variant)
    if args.ops and run.config.algorithm != "sac":
        parser.error(f"--ops profiles a SAC update; {args.variant} is {run.config.algorithm}")
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            **run.settings,
            "output_dir": tmp,
            "threads": args.threads,
            **({"total_steps": args.steps} if args.steps else {}),
        }
        trainer = Trainer(parse_config(settings))
        profiler = cProfile.Profile()
        profiler.runcall(trainer.run)
        cycle = update_operators(trainer) if args.ops else None
    stats = pstats.Stats(profiler)
    totals, outside = breakdown(stats)
    wall = sum(totals.values())
    print(f"{args.experiment} / {args.variant}: {trainer.env_steps} environment steps, {wall:.1f} s profiled")
    for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<36}{seconds:>8.1f} s {100 * seconds / wall:>6.1f} %")
    overhead = wall - totals.get(MODEL, 0.0)
    print(f"  {'overhead around the model':<36}{overhead:>8.1f} s {100 * overhead / wall:>6.1f} %")
    print("phases of the loop (cumulative time):")
    phases = {  # label: (file, function); top-level steps of the training loop, not nested in each other
        "acting (policy forward)": ("sacglam_core/algos/", "act"),
        "updates (forward, backward, optimizer)": ("sacglam_core/algos/", "update"),
        "environment step (vector of environments)": ("sacglam_core/envs/vector.py", "step"),
        "episode recording": ("sacglam_core/trajectories.py", "step"),
        "evaluation": ("sacglam_core/evaluation.py", "evaluate"),
        "checkpoints": ("sacglam_core/trainer.py", "_save"),
    }
    for label, (where, function) in phases.items():
        seconds = sum(row[3] for (f, _, n), row in stats.stats.items() if n == function and where in f)
        print(f"  {label:<44}{seconds:>8.1f} s {100 * seconds / wall:>6.1f} %")
    print("slowest functions outside the model (self time):")
    for seconds, where in sorted(outside, reverse=True)[: args.top]:
        print(f"  {seconds:>7.2f} s  {where}")
    if cycle is not None:
        print_operators(*cycle, matmul_peak(), args.ops)


def update_operators(trainer: Trainer) -> tuple[list, dict[str, int]]:
    """torch.profiler's per-operator totals over one more update cycle of the finished run's SAC, and the FLOPs
    per operator of the same cycle, counted on a copy of the algorithm (counting under the profiler would slow
    what it times)."""
    twin = copy.deepcopy(trainer.algo)  # its replay buffer's generator too: it samples the same batches
    with FlopCounterMode(display=False) as counter:
        twin.update(trainer.recorder, trainer.env_steps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.algo.update(trainer.recorder, trainer.env_steps)
    flops = {str(op).replace(".", "::"): n for op, n in counter.get_flop_counts()["Global"].items()}
    return list(prof.key_averages()), flops


def matmul_peak(size: int = 1024) -> float:
    """GFLOP/s of one large float32 matrix product on this process's threads: what the core can do."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    seconds = torch.utils.benchmark.Timer("a @ b", globals={"a": a, "b": b}).blocked_autorange(min_run_time=1.0)
    return 2 * size**3 / seconds.median / 1e9


def print_operators(operators: list, flops: dict[str, int], peak: float, top: int) -> None:
    """The slowest operators, then how fast the matrix products run against the core's own peak: a cycle
    whose products already run near it can be made faster only by doing fewer of them."""
    total = sum(e.self_cpu_time_total for e in operators)
    print(f"torch operators of one SAC update cycle after the run ({total / 1e3:.0f} ms, self time):")
    for event in sorted(operators, key=lambda e: -e.self_cpu_time_total)[:top]:
        milliseconds, share = event.self_cpu_time_total / 1e3, 100 * event.self_cpu_time_total / total
        rate = f"  {flops[event.key] / event.self_cpu_time_total / 1e3:6.1f} GFLOP/s" if event.key in flops else ""
        print(f"  {event.key:<48}{milliseconds:>9.1f} ms {share:>6.1f} %  {event.count:>5} calls{rate}")
    products = [e for e in operators if e.key in flops]
    seconds = sum(e.self_cpu_time_total for e in products) / 1e6
    counted = sum(flops[e.key] for e in products)
    print(
        f"matrix products ({', '.join(sorted(e.key for e in products))}): {counted / 1e9:.2f} GFLOP in"
        f" {1e3 * seconds:.0f} ms ({100 * seconds * 1e6 / total:.0f}% of the cycle), {counted / seconds / 1e9:.1f}"
        f" GFLOP/s; a 1024x1024 float32 product on this core: {peak:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
