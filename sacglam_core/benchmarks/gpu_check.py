"""A one-command check of a CUDA machine at the paper's scale, which measures the training speed the GPU-hour
budget prices this GPU type from.

    python -m sacglam_core.benchmarks.gpu_check [--steps 520] [--both-dtypes]
    python -m sacglam_core.benchmarks.gpu_check --device cpu --model resources/models/tiny-t5 --steps 72 --small

On a Flan-T5-base-shaped model (random weights, built here: no Hub) with LoRA and 4-bit weights:
- scoring: the policy over the candidates of 32 environments, prompts/s and actions/s, in the dtype that
  `model.dtype: auto` picks for this GPU and in the other half-precision dtype;
- `--steps` environment steps of SAC-GLAM+HER and of PPO-GLAM with the paper's settings for one of its 4 ranks
  (8 environments; SAC: 2 updates of 64 every 8 steps, warm-up off so that the actor learns within the run; PPO:
  512 steps, 16 epochs of 64), evaluation and checkpoints off, in the auto dtype (`--both-dtypes`: in the other
  too): environment steps/s in steady state (SAC from its first update on, when every cycle updates; PPO over
  whole rollout+update cycles) beside the whole run's, updates/s, the GPU's busy fraction (kernel time over wall
  time in `--busy-steps` more steps, profiled), peak GPU memory, and the achieved TFLOP/s in steady state, from
  the FLOPs that benchmarks/step_cost.py counts for the same settings;
- that the LoRA weights changed and every loss is finite (exit status 1 if not).
Then it writes the steady rates, with the GPU, dtype, weights, critic, versions, commit, date and command, to
workflow/config/gpu_rates/<GPU type>.yaml (`--rates FILE` elsewhere), from which the budget prices runs on that
GPU type: commit the file (docs/cluster.md).

About 6 minutes on an H100, estimated from the earlier default, which trained in both dtypes in about 9: a minute
to build the model and score, about 50 s per variant to count FLOPs, load and start, then runs of about 110 s
(SAC-GLAM+HER) and 60 s (PPO-GLAM); `--both-dtypes` adds about 4 minutes.
`--device cpu` runs the same logic on a CPU, with a tiny model, for tests (the busy fraction is then not
applicable); `--small` shrinks PPO's rollout to 64 steps of 2 epochs there (4-bit weights compute slowly on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.benchmarks.step_cost import counting_agent, masks_without_values, random_play, step_cost
from sacglam_core.config import CriticConfig, RunConfig, parse_config
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.models.loading import load_tokenizer, resolve_dtype
from sacglam_core.models.shapes import save_flan_t5_base_shaped
from sacglam_core.pipeline import budget, gpu_rates
from sacglam_core.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "workflow" / "config" / "calibration.yaml"  # its GPU types name the rates file
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
            "warmup_cycles": 0,  # the actor learns from the first cycle: a run's steady cost from its first update
        },
    },
    "PPO-GLAM": {"algorithm": "ppo", "ppo": {"rollout_steps": 512, "epochs": 16, "minibatch_size": 64}},
}
SMALL = {"ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32}}  # --small: PPO updates within 64 steps
LOSSES = ("critic_loss", "actor_loss", "policy_loss", "value_loss")


def described(model: str, ppo: dict, steps: int) -> str:
    """What a measurement measured, for its rates file."""
    return (
        f"One rank of the paper's run at gpu_check's per-rank settings: 8 environments; SAC-GLAM+HER with the paper's "
        f"critic, 2 updates of 64 every 8 steps, warm-up off; PPO-GLAM, {ppo['rollout_steps']}-step rollouts of "
        f"{ppo['epochs']} epochs of {ppo['minibatch_size']}; {model}, LoRA, 4-bit weights; {steps} steps measured per "
        f"run. Steady: SAC from its first update on, PPO over whole rollout+update cycles."
    )


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


@dataclass(frozen=True)
class Mark:
    """The loop after an environment step (or before the first): its environment steps, updates and clock."""

    steps: int
    updates: int
    seconds: float


@dataclass(frozen=True)
class Figures:
    """One variant's measured run."""

    steady: float  # env steps/s: SAC from its first update on, PPO over whole rollout+update cycles (NaN: none)
    whole_run: float  # env steps/s over the measured steps
    updates_per_s: float  # in the steady window
    busy: float | None  # GPU kernel time / wall time over the profiled steps after the measured ones; None on a CPU
    peak_memory_gib: float | None  # None on a CPU
    tflops: float  # achieved in steady state: the FLOPs step_cost counts per step x the steady rate


def rates(marks: list[Mark], algorithm: str) -> tuple[float, float, float]:
    """(steady env steps/s, whole-run env steps/s, steady updates/s) from the marks of the measured steps; NaN for a
    steady state that the marks do not reach."""

    def per_second(first: Mark, last: Mark, what: str) -> float:
        seconds = last.seconds - first.seconds
        return (getattr(last, what) - getattr(first, what)) / seconds if seconds > 0 else math.nan

    updated = [now for before, now in zip(marks, marks[1:]) if now.updates > before.updates]
    if algorithm == "sac":  # from its first update on, when every cycle updates
        first, last = (updated[0] if updated else marks[-1]), marks[-1]
    else:  # PPO: whole rollouts with their updates
        first, last = marks[0], (updated[-1] if updated else marks[0])
    whole_run = per_second(marks[0], marks[-1], "steps")
    return per_second(first, last, "steps"), whole_run, per_second(first, last, "updates")


def train(config: RunConfig, measured: int, flops_per_step: float) -> tuple[Figures | None, list[str]]:
    """One short run (`config.total_steps`): its first `measured` steps timed, then on a GPU the kernels of the
    following ones profiled (the last step, which evaluates, is neither); its figures, and the checks that failed."""
    cuda = config.model.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config)
    lora = [p.detach().clone() for p in trainer.agent.lm.parameters_of()]
    marks: list[Mark] = []
    busy = {}  # the profiled window: its profile and wall seconds
    profiling = contextlib.ExitStack()
    step = trainer._step

    def mark() -> None:
        marks.append(Mark(trainer.env_steps, trainer.algo.updates, time.perf_counter()))

    def timed(started: float) -> None:
        if cuda and trainer.env_steps >= measured and not busy:
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CUDA]  # kernels only: little host overhead
            busy["profile"] = profiling.enter_context(torch.profiler.profile(activities=activities))
            busy["start"] = time.perf_counter()
        elif cuda and trainer.env_steps >= config.total_steps - config.num_envs and "wall" not in busy:
            torch.cuda.synchronize()
            busy["wall"] = time.perf_counter() - busy["start"]
            profiling.close()
        if not marks:
            mark()
        step(started)
        mark()

    trainer._step = timed
    with profiling:
        finished = trainer.run() == 0
    if not finished:
        return None, ["the run did not finish"]
    with (Path(config.output_dir) / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    steady, whole_run, updates_per_s = rates([m for m in marks if m.steps <= measured], config.algorithm)
    figures = Figures(
        steady=steady,
        whole_run=whole_run,
        updates_per_s=updates_per_s,
        busy=busy_fraction(busy["profile"], busy["wall"]) if cuda else None,
        peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        tflops=flops_per_step * steady / 1e12,
    )
    failed = []
    if not any((a != b.detach()).any() for a, b in zip(lora, trainer.agent.lm.parameters_of())):
        failed.append("the LoRA weights did not change")
    for loss in LOSSES:
        if last.get(loss) not in (None, "") and not math.isfinite(float(last[loss])):
            failed.append(f"{loss} is {last[loss]}")
    return figures, failed


def busy_fraction(profile, wall: float) -> float:
    """The GPU's kernel time over `wall` seconds, from a profile of its kernels."""
    kernels = sum(e.self_device_time_total for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return kernels / 1e6 / wall


def row(variant: str, algorithm: str, figures: Figures | None, flops: float, failed: list[str]) -> str:
    """The table's line of one variant's run."""
    cells = ["-"] * 6
    if figures is not None:
        busy = "n/a (CPU)" if figures.busy is None else f"{figures.busy:.0%}"
        if figures.busy is not None and algorithm == "ppo":
            busy += " (acting)"  # a short window holds no 16-epoch update
        memory = "-" if figures.peak_memory_gib is None else f"{figures.peak_memory_gib:.1f} GiB"
        rates = f"{figures.steady:.1f}", f"{figures.whole_run:.1f}", f"{figures.updates_per_s:.2f}"
        cells = [*rates, busy, memory, f"{figures.tflops:.2f}"]
    checks = "; ".join(failed) or "LoRA trained, losses finite"
    return f"| {variant} | {' | '.join(cells)} | {flops / 1e9:.1f} | {checks} |"


def commit() -> str | None:
    """The repository's commit (`-dirty` with uncommitted changes), None outside a git checkout."""
    try:
        described = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--exclude=*"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return described.stdout.strip() or None


def write_rates(
    path: Path, gpu: str, device_name: str, measured: dict[str, dict[str, Figures]], command: str, notes: str
) -> gpu_rates.GpuRates:
    """Write the steady and whole-run rates of each dtype's runs (`measured`: dtype -> algorithm key -> figures) to
    the rates file `path` of GPU type `gpu`, over the measurements of the same settings there; `notes`: what they
    measured."""
    import transformers

    measurements = []
    for dtype, runs in measured.items():
        speeds = {
            algorithm: gpu_rates.Speed(None if math.isnan(f.steady) else round(f.steady, 2), round(f.whole_run, 2))
            for algorithm, f in runs.items()
        }
        achieved = "; ".join(
            f"{algorithm}: {f.tflops:.3g} TFLOP/s"
            + ("" if f.busy is None else f", GPU busy {f.busy:.0%}")
            + ("" if f.peak_memory_gib is None else f", {f.peak_memory_gib:.1f} GiB")
            for algorithm, f in runs.items()
        )
        measurements.append(
            gpu_rates.Measurement(
                dtype=dtype,
                load_in_4bit=True,
                critic=CriticConfig().input,  # PER_RANK keeps the paper's critic
                env_steps_per_s=speeds,
                device_name=device_name,
                date=datetime.date.today(),
                command=command,
                commit=commit(),
                torch=torch.__version__,
                transformers=transformers.__version__,
                notes=f"{notes} {achieved}.",
            )
        )
    return gpu_rates.record(path, gpu, measurements)


def rates_file(args: argparse.Namespace, device_name: str) -> tuple[Path | None, str, str]:
    """Where the measured rates go, the GPU type they are of, and why they go nowhere where they would misprice the
    budget. A bad rates file already there stops the check before it measures."""
    calibration = budget.load_table(TABLE)
    gpu = calibration.gpu_type(device_name)
    if args.rates:
        if args.rates.exists():
            gpu_rates.load(args.rates, [gpu])
        return args.rates, gpu, ""
    if not args.device.startswith("cuda"):
        return None, gpu, "a CPU is not a GPU type of the budget"
    if gpu not in calibration.gpus:
        return None, gpu, f"{device_name} is not a GPU of {TABLE} ({', '.join(calibration.gpus)}): add it there"
    if args.model or args.small:
        return None, gpu, "--model and --small do not run the paper's per-rank run"
    return calibration.rates_folder / f"{gpu}.yaml", gpu, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", type=Path, help="a model folder (default: a Flan-T5-base-shaped one, built here)")
    parser.add_argument(
        "--steps", type=positive, default=520, help="environment steps measured in each run (more than PPO's rollout)"
    )
    parser.add_argument(
        "--busy-steps", type=positive, default=16, help="environment steps profiled after them on a GPU (at least 8)"
    )
    parser.add_argument("--both-dtypes", action="store_true", help="train in the other dtype too, not only score")
    parser.add_argument("--rates", type=Path, help="the rates file to write (default: the budget's, for this GPU)")
    parser.add_argument("--small", action="store_true", help="PPO: 64-step rollouts of 2 epochs (CPU tests)")
    add_threads_argument(parser)
    args = parser.parse_args()
    rollout = (SMALL if args.small else PER_RANK["PPO-GLAM"])["ppo"]["rollout_steps"]
    if args.steps <= rollout:  # PPO would never update, and its LoRA check would fail for that reason alone
        parser.error(f"--steps must exceed PPO's rollout of {rollout} steps, so that PPO updates at least once")
    if args.busy_steps < 8:  # a step of the 8 environments, between the measured steps and the last, evaluating one
        parser.error("--busy-steps must be at least 8, one step of the 8 environments")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("no CUDA device here; `--device cpu --model <tiny model>` checks the logic on a CPU")
    pin_threads(args.threads)
    name = torch.cuda.get_device_name(args.device) if cuda else "CPU"
    try:
        rates_path, gpu, unwritten = rates_file(args, name)
    except ValueError as error:  # a bad calibration table or rates file: one line, before minutes of measuring
        print(f"error: {error}", file=sys.stderr)
        return 2
    # after the measured steps: the profiled ones, then the last step, which evaluates (a metrics row for the checks)
    total = args.steps + (args.busy_steps if cuda else 0) + 8
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_flan_t5_base_shaped(Path(tmp) / "flan-t5-base-shaped")
        probe = run_config("PPO-GLAM", model, args.device, "auto", total, Path(tmp))
        auto = resolve_dtype(probe.model)
        other = "float16" if auto == "bfloat16" else "bfloat16"
        print(f"gpu_check: {name}, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), model {model}")
        print(f"dtype auto picks {auto}; also checked: {other}" + ("" if args.both_dtypes else " (scoring only)"))
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model)
        failures: list[str] = []
        measured: dict[str, dict[str, Figures]] = {}
        for dtype in (auto, other):
            print(f"\n## {dtype}{' (auto)' if dtype == auto else ''}")
            print(
                f"scoring, 32 environments: {scoring(run_config('PPO-GLAM', model, args.device, dtype, 1, Path(tmp)))}"
            )
            if dtype != auto and not args.both_dtypes:
                continue
            print(
                "| variant | env steps/s, steady | env steps/s, whole run | updates/s | GPU busy | peak memory "
                "| achieved TFLOP/s | GFLOP/step | checks |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for variant in PER_RANK:
                out = Path(tmp) / f"{dtype}-{variant}"
                config = run_config(variant, model, args.device, dtype, total, out, args.small)
                play = random_play(PromptTokens(load_tokenizer(config.model)), vector_steps=60, num_envs=8)
                with masks_without_values():
                    cost = step_cost(counting_agent(config, hf_config), config, play, ranks=1, batches=2)
                flops = cost.total - cost.parts["evaluation"]  # the runs do not evaluate
                figures, failed = train(config, args.steps, flops)
                failures += [f"{dtype} {variant}: {f}" for f in failed]
                if figures is not None:
                    measured.setdefault(dtype, {})[budget.algorithm_key(config)] = figures
                print(row(variant, config.algorithm, figures, flops, failed), flush=True)
    busy = f"kernel time / wall time over the {args.busy_steps} steps after them (PPO's: acting only)"
    print(
        f"\nsteady: SAC from its first update on, PPO over whole rollout+update cycles, within the first {args.steps} "
        f"steps; GPU busy: {busy if cuda else 'not applicable on a CPU'}"
    )
    if failures:
        print("rates not written: a check failed")
    elif rates_path is None:
        print(f"rates not written: {unwritten}; --rates FILE writes them")
    else:
        command = " ".join(["python -m sacglam_core.benchmarks.gpu_check", *sys.argv[1:]])
        ppo = (SMALL if args.small else PER_RANK["PPO-GLAM"])["ppo"]
        shape = "Flan-T5-base's shape with random weights" if args.model is None else f"the model {args.model}"
        write_rates(rates_path, gpu, name, measured, command, described(shape, ppo, args.steps))
        budgets = "" if args.rates else f": the budget prices runs on {gpu} from it; commit it"
        print(f"rates written to {rates_path}{budgets}")
    print("\nFAILED: " + "; ".join(failures) if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
