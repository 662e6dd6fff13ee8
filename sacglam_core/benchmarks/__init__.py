"""Benchmark scripts: each prints the figures it measures (`python -m sacglam_core.benchmarks.<name>`).

    env_throughput      vector-environment steps/s (32 environments, random valid actions)
    scoring_throughput  GLAM scoring, naive against batched; the critic's forward+backward per critic input
    train_throughput    environment steps/s of PPO-GLAM, SAC-GLAM and SAC-GLAM+HER in short runs
    step_cost           FLOPs per environment step at the paper's scale, memory per rank, implied GPU-hours
    gpu_check           the benchmark of one rank on a CUDA machine at the paper's scale, eager and captured
                        side by side (steps/s, kernel time and kernels per update, TFLOP/s, memory); writes the
                        rates the GPU-hour budget prices that GPU from
    precision           the same short run in fp32, bf16 and fp16 (GradScaler), losses side by side
    census              the CPU census of one rank's hot loop: LLM stack forwards per update, distinct shapes,
                        host traffic inside updates, float32 share of matrix products, graph breaks
    node_check          what a cluster job does first, on one GPU: 2 processes over gloo against 2 ranks in one
                        process, float16 captured against eager with a forced overflow, gpu_smoke's first job

Libraries: `faults` (fault injection on the device: a forced float16 overflow, a check against host reads), which
node_check and the tests use; `flops` (FLOPs counted as the device runs them, 4-bit products included), which
gpu_check, step_cost and census share; `kernels` (a profiled window's kernel time by kind), which gpu_check prints.

One-off studies behind earlier choices live in `sacglam_core.studies` (compare_revisions, final_policies) or
only in git history (padding, warmup_collapse, sac_update_speed): docs/studies/benchmark-studies.md.

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
    """Set torch's CPU threads and kernels as a run does, print them, and return the threads (a run configuration's
    `threads`)."""
    import torch

    from sacglam_core.cpu import pin_kernels

    if threads < 1:
        raise SystemExit(f"error: --threads must be at least 1, got {threads}")
    kernels = pin_kernels()
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), {kernels} kernels", flush=True)
    return threads
