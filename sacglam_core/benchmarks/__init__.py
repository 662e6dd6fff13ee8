"""Benchmark scripts: each prints the figures it measures (`python -m sacglam_core.benchmarks.<name>`).

Every benchmark pins its torch threads (`--threads`, default 1) and prints them: on a shared 2-core machine,
torch's default of one thread per core made batched scoring 27x slower (OpenMP oversubscription).
"""

import argparse


def positive(text: str) -> int:
    """An argparse type: an integer of at least 1 (steps, episodes)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")


def pin_threads(threads: int) -> int:
    """Set torch's CPU threads, print them, and return them (a run configuration's `threads`)."""
    import torch

    if threads < 1:
        raise SystemExit(f"error: --threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s)", flush=True)
    return threads
