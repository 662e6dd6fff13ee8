"""The benchmark of one rank: a CUDA machine at the paper's scale, eager, captured and compiled side by side, and
the rates that the GPU-hour budget prices this GPU type from.

    python -m sacglam_core.benchmarks.gpu_check [--steps 1088] [--variants ...] [--modes eager,captured,compiled]
    python -m sacglam_core.benchmarks.gpu_check --device cpu --model resources/models/tiny-t5 --steps 128 --small

On a Flan-T5-base-shaped model (random weights, built here: no Hub) with LoRA and 4-bit weights, in the dtype that
`model.dtype: auto` picks (`--dtype` another: float16 measures a V100's compute dtype on a newer GPU), each variant
trains `--steps` environment steps at the paper's settings for one of its 4 ranks (8 environments; SAC: 2 updates
of 64 every 8 steps, warm-up off so that the actor learns within the run; PPO: 512 steps, 16 epochs of 64),
evaluation and checkpoints off, in each mode:
- `eager`: every pass launched kernel by kernel from Python (`model.capture: false`);
- `captured`: each kind of pass and update replayed from a CUDA graph (agent/static.py), blocks not compiled;
- `compiled`: captured, and each transformer block compiled (`model.compile`), the default on a GPU.
Variants: SAC-GLAM+HER with the paper's critic; with the one-pass critic (`decoded_action`, no target LM);
PPO-GLAM; and SAC-GLAM+HER's four ranks held by one process on one GPU (`ranks: 4`: 32 environments, batches of 256).
For each run it prints: environment steps/s in steady state (SAC from the middle of its updating steps on, PPO over
the rollout+update cycles after its first) and over the whole run; then, over `--profile-steps` more steps under
torch.profiler, the GPU's kernel time and kernels per update and per environment step, TFLOP/s during kernel time
(FLOPs counted on the run's own first, eager, calls, by benchmarks/flops.py: 4-bit products included), the
host's operator calls per update, and a kernel table (benchmarks/kernels.py: kernel time by kind, the 10 most
expensive kernels); the seconds spent capturing and compiling; peak memory; and checks that the LoRA weights changed
and every loss is finite (exit status 1 if not). Each run's figures are also written as a JSON line (`--json FILE`)
as soon as it ends. `--weights dequantized` measures the paper's 4-bit weights dequantized once at load
(`model.dequantize_4bit`), `--weights dense` the model's own weights in the compute dtype, instead of 4-bit (the
paper's setting, the default), and records their rates as such.

Then it writes the steady rates of the default mode (compiled where measured, else captured, else eager), with the
GPU, dtype, weights, critic, versions, commit, date and command, to workflow/config/gpu_rates/<GPU type>.yaml
(`--rates FILE` elsewhere), from which the budget prices runs on that GPU type: commit the file (docs/cluster.md).
`--device cpu` runs the same logic on a CPU with a tiny model, for tests (eager only: there is nothing to capture
there); `--small` shrinks PPO's rollout to 64 steps of 2 epochs.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gc
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.benchmarks.flops import FlopCounter
from sacglam_core.benchmarks.kernels import KernelTable, kernel_table
from sacglam_core.config import RunConfig, parse_config
from sacglam_core.device_plan import DevicePlan
from sacglam_core.jobs import budget, gpu_rates
from sacglam_core.models.shapes import save_flan_t5_base_shaped
from sacglam_core.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "workflow" / "config" / "calibration.yaml"  # its GPU types name the rates file
SAC_PER_RANK = {
    "update_every": 8,
    "updates_per_cycle": 2,
    "batch_size": 64,
    "alpha_init": 0.05,
    "target_entropy": 0.01,
    "warmup_cycles": 0,  # the actor learns from the first cycle: a run's steady cost from its first update
}
VARIANTS = {  # the paper's run (Tables 1-3, 32 environments, global batch 256) seen from one of 4 ranks
    "SAC-GLAM+HER": {"algorithm": "sac", "her": {"enabled": True}, "sac": SAC_PER_RANK},
    "SAC-GLAM+HER (one-pass critic)": {
        "algorithm": "sac",
        "her": {"enabled": True},
        "sac": {**SAC_PER_RANK, "critic": {"input": "decoded_action", "target_lm": False}},
    },
    "PPO-GLAM": {"algorithm": "ppo", "ppo": {"rollout_steps": 512, "epochs": 16, "minibatch_size": 64}},
    "SAC-GLAM+HER (4 ranks on one GPU)": {
        "algorithm": "sac",
        "her": {"enabled": True},
        "sac": {**SAC_PER_RANK, "update_every": 32, "batch_size": 256},
        "num_envs": 32,
        "ranks": 4,
    },
}
SMALL = {"ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32}}  # --small: PPO updates within 64 steps
MODES = {"eager": {"capture": False, "compile": False}, "captured": {"compile": False}, "compiled": {"compile": True}}
WEIGHTS = {  # --weights: the base weights' settings
    "4bit": {"load_in_4bit": True},
    "dequantized": {"load_in_4bit": True, "dequantize_4bit": True},
    "dense": {"load_in_4bit": False},
}


def weights_words(weights: str, dtype: str) -> str:
    return {"4bit": "4-bit weights", "dequantized": "4-bit weights dequantized once"}.get(weights, f"{dtype} weights")


LOSSES = ("critic_loss", "actor_loss", "policy_loss", "value_loss")


def run_config(
    variant: str,
    model: Path,
    device: str,
    mode: str,
    steps: int,
    out: Path,
    small: bool,
    dtype: str = "auto",
    weights: str = "4bit",
) -> RunConfig:
    settings = VARIANTS[variant]
    model_settings = {"name_or_path": str(model), "device": device, "dtype": dtype, "lora": {}, **WEIGHTS[weights]}
    return parse_config(
        {
            **settings,
            **(SMALL if small and settings["algorithm"] == "ppo" else {}),
            "model": model_settings | MODES[mode],
            "output_dir": str(out),
            "num_envs": settings.get("num_envs", 8),
            "total_steps": steps,
            "threads": torch.get_num_threads(),
            "eval": {"every_steps": 10**9, "episodes_per_type": 1, "test_episodes": 1},
            "checkpoint": {"every_updates": 10**9},
            "monitor": {"tensorboard": False, "scalars_every_steps": 10**6, "progress_every_steps": 10**6},
        }
    )


@dataclass(frozen=True)
class Mark:
    """The loop after an environment step (or before the first): its environment steps, updates, clock and the kinds
    of captured call it has met."""

    steps: int
    updates: int
    seconds: float
    graphs: int = 0


@dataclass
class Figures:
    """One run's measurements; None where not measured (a CPU, or nothing in the window)."""

    steady: float  # env steps/s (NaN: no steady window)
    whole_run: float
    updates_per_s: float  # in the steady window
    kernel_ms_per_update: float | None = None
    kernels_per_update: float | None = None
    kernel_ms_per_step: float | None = None  # per environment step, its share of updates included
    busy: float | None = None  # kernel time over wall time in the profiled window
    tflops: float | None = None  # during kernel time
    operator_calls_per_update: float | None = None  # host calls into torch's dispatcher
    capture_seconds: float = 0.0  # capturing graphs and compiling (the first calls of each shape)
    new_graphs: int = 0  # kinds of call first met in the steady window: eager calls, a capture, a compilation each
    peak_memory_gib: float | None = None
    statistics: dict[str, float] | None = None  # the run's training statistics (the same in every mode, up to rounding)
    kernels: KernelTable | None = None  # the profiled window's kernel time by kind, and its most expensive kernels


def profiled_steps(requested: int, envs: int) -> int:
    """The environment steps profiled for `requested`: whole steps of the `envs` environments, which step together
    (a window that ends between two steps would never close)."""
    return -(-requested // envs) * envs


def rates(marks: list[Mark], algorithm: str) -> tuple[float, float, float, int]:
    """(steady env steps/s, whole-run env steps/s, steady updates/s, kinds of captured call first met in the steady
    window) from the marks of the measured steps; NaN for a steady state that the marks do not reach. SAC's steady
    window starts halfway through its updating steps (its first updates of each shape run eagerly, then are
    captured); PPO's covers the whole rollout+update cycles after its first, whose update meets every kind of call
    first."""

    def per_second(first: Mark, last: Mark, what: str) -> float:
        seconds = last.seconds - first.seconds
        return (getattr(last, what) - getattr(first, what)) / seconds if seconds > 0 else math.nan

    updated = [now for before, now in zip(marks, marks[1:]) if now.updates > before.updates]
    if algorithm == "sac":
        first, last = (updated[len(updated) // 2] if updated else marks[-1]), marks[-1]
    else:
        first, last = (updated[0], updated[-1]) if updated else (marks[0], marks[0])
    return (
        per_second(first, last, "steps"),
        per_second(marks[0], marks[-1], "steps"),
        per_second(first, last, "updates"),
        last.graphs - first.graphs,
    )


class Counted:
    """FLOPs of one eager call of each of the loop's calls that cost (acting, a SAC update, a PPO minibatch step), and
    the calls made since `mark`."""

    CALLS = {"act": 1, "_update": 2, "_minibatch_step": 1}  # which call to count: SAC's first update measures policy_kl

    def __init__(self, trainer: Trainer) -> None:
        self.flops: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        for name in self.CALLS:
            if hasattr(trainer.algo, name):
                self._wrap(trainer.algo, name)

    def _wrap(self, algo, name: str) -> None:
        original = getattr(algo, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.calls[name] != self.CALLS[name]:
                return original(*args, **kwargs)
            # compiled blocks cannot run under a dispatch mode: this one call runs them eagerly
            with torch.compiler.set_stance("force_eager"), FlopCounter() as counter:
                out = original(*args, **kwargs)
            self.flops[name] = counter.total
            return out

        setattr(algo, name, counted)

    def since(self, calls: dict[str, int]) -> float:
        """FLOPs of the calls made since the counts `calls`."""
        return sum(self.flops.get(k, 0) * (n - calls.get(k, 0)) for k, n in self.calls.items())


def profile_window(profile, wall: float, updates: int, steps: int, flops: float) -> dict:
    """Kernel time, kernels and operator calls of a profiled window of `steps` environment steps and `updates`."""
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_seconds = sum(e.self_device_time_total for e in kernels) / 1e6
    calls = 0
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("aten::"):
            parent = event.cpu_parent
            calls += parent is None or not parent.name.startswith("aten::")  # outermost: a call from Python
    per_update = max(updates, 1)
    return {
        "kernel_ms_per_update": 1e3 * kernel_seconds / per_update if updates else None,
        "kernels_per_update": len(kernels) / per_update if updates else None,
        "kernel_ms_per_step": 1e3 * kernel_seconds / steps,
        "busy": kernel_seconds / wall,
        "tflops": flops / kernel_seconds / 1e12 if kernel_seconds else None,
        "operator_calls_per_update": calls / per_update if updates else None,
        "kernels": kernel_table(
            [(e.name, e.self_device_time_total) for e in kernels],
            updates or steps,
            "update" if updates else "environment step",
        ),
    }


def train(config: RunConfig, measured: int, profiled: int) -> tuple[Figures | None, list[str]]:
    """One short run: its first `measured` steps timed, then on a GPU `profiled` steps profiled (the last step, which
    evaluates, is neither); its figures, and the checks that failed."""
    cuda = config.model.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config)
    counted = Counted(trainer)
    lora = [p.detach().clone() for p in trainer.agent.lm.parameters_of()]
    marks: list[Mark] = []
    window: dict = {}
    profiling = contextlib.ExitStack()
    step, graphs = trainer._step, trainer.agent.graphs

    def timed(started: float) -> None:
        if cuda and trainer.counters.env_steps == measured:
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            window.update(profile=profiling.enter_context(torch.profiler.profile(activities=activities)))
            window.update(start=time.perf_counter(), updates=trainer.algo.updates, steps=trainer.counters.env_steps)
            window.update(calls=dict(counted.calls))
        elif cuda and trainer.counters.env_steps == measured + profiled and "wall" not in window:
            torch.cuda.synchronize()
            window.update(wall=time.perf_counter() - window["start"], flops=counted.since(window["calls"]))
            window.update(
                updates=trainer.algo.updates - window["updates"], steps=trainer.counters.env_steps - window["steps"]
            )
            profiling.close()
        if not marks:
            marks.append(Mark(trainer.counters.env_steps, trainer.algo.updates, time.perf_counter(), graphs.kinds))
        step(started)
        marks.append(Mark(trainer.counters.env_steps, trainer.algo.updates, time.perf_counter(), graphs.kinds))
        if trainer.counters.env_steps == measured:  # the rates at once: a run cut short while profiling keeps them
            steady, whole_run, _, _ = rates(marks, config.algorithm)
            name, steady = Path(config.output_dir).name, cell(steady, ".1f")
            figures = f"steady {steady} env steps/s, whole run {whole_run:.1f}"
            print(f"{name}: {measured:,} steps measured: {figures}", flush=True)

    trainer._step = timed
    with profiling:
        finished = trainer.run() == 0
    if not finished:
        return None, ["the run did not finish"]
    with (Path(config.output_dir) / "metrics.csv").open() as f:
        last = list(csv.DictReader(f))[-1]
    steady, whole_run, updates_per_s, new_graphs = rates([m for m in marks if m.steps <= measured], config.algorithm)
    statistics = {k: float(last[k]) for k in (*LOSSES, "mean_q", "entropy", "alpha") if last.get(k) not in (None, "")}
    spent = trainer.agent.graphs.seconds + trainer.compile_seconds()
    figures = Figures(steady, whole_run, updates_per_s, capture_seconds=spent, new_graphs=new_graphs)
    figures.statistics = statistics
    if cuda and "wall" in window:
        measured = profile_window(
            window["profile"], window["wall"], window["updates"], window["steps"], window["flops"]
        )
        for key, value in measured.items():
            setattr(figures, key, value)
    if cuda:  # what the allocator held at its peak: what a GPU must fit (the whole run, its compilation included)
        figures.peak_memory_gib = torch.cuda.max_memory_reserved() / 2**30
    failed = []
    if not any((a != b.detach()).any() for a, b in zip(lora, trainer.agent.lm.parameters_of())):
        failed.append("the LoRA weights did not change")
    for loss in LOSSES:
        if last.get(loss) not in (None, "") and not math.isfinite(float(last[loss])):
            failed.append(f"{loss} is {last[loss]}")
    trainer._step = step  # no cycle keeps the trainer, and its graphs' memory, past the run
    return figures, failed


def cell(value: float | None, form: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, form)


def row(variant: str, mode: str, f: Figures | None, failed: list[str]) -> str:
    """The table's line of one run."""
    cells = ["-"] * 12
    if f is not None:
        memory = cell(f.peak_memory_gib, ".1f")
        cells = [
            cell(f.steady, ".1f"), cell(f.whole_run, ".1f"), cell(f.updates_per_s, ".2f"),
            cell(f.kernel_ms_per_update, ".0f"), cell(f.kernels_per_update, ",.0f"), cell(f.kernel_ms_per_step, ".0f"),
            cell(f.busy, ".0%"), cell(f.tflops, ".1f"), cell(f.operator_calls_per_update, ",.0f"),
            f"{f.capture_seconds:.0f}", str(f.new_graphs), memory + ("" if memory == "-" else " GiB"),
        ]  # fmt: skip
    checks = "; ".join(failed) or "LoRA trained, losses finite"
    return f"| {variant} | {mode} | {' | '.join(cells)} | {checks} |"


HEADER = (
    "| variant | mode | env steps/s, steady | whole run | updates/s | kernel ms / update | kernels / update "
    "| kernel ms / env step | GPU busy | TFLOP/s in kernels | operator calls / update | capture+compile s "
    "| graphs new in steady window | peak memory | checks |\n" + "| --- " * 15 + "|"
)


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
    path: Path,
    gpu: str,
    device_name: str,
    dtype: str,
    runs: dict[tuple[str, str], Figures],
    command: str,
    weights: str = "4bit",
) -> gpu_rates.GpuRates:
    """Write the steady and whole-run rates of the per-rank runs in the default mode (compiled where measured) to the
    rates file `path` of GPU type `gpu`, over the measurements of the same settings there."""
    import transformers

    def mode_of(variant: str) -> str | None:  # the default mode's, else another with a steady rate, else any
        measured = [m for m in ("compiled", "captured", "eager") if (variant, m) in runs]
        return next((m for m in measured if not math.isnan(runs[variant, m].steady)), next(iter(measured), None))

    by_setting: dict[tuple[str, int], dict[str, gpu_rates.Speed]] = {}  # (critic, ranks per GPU) -> speeds
    notes: dict[tuple[str, int], list[str]] = {}
    for variant in VARIANTS:
        mode = mode_of(variant)
        if mode is None:
            continue
        f = runs[variant, mode]
        setting = ("decoded_action" if "one-pass" in variant else "obs_action", VARIANTS[variant].get("ranks", 1))
        key = "ppo" if variant == "PPO-GLAM" else "sac+her"
        steady = None if math.isnan(f.steady) else round(f.steady, 2)
        memory = None if f.peak_memory_gib is None else round(f.peak_memory_gib, 1)
        by_setting.setdefault(setting, {})[key] = gpu_rates.Speed(steady, round(f.whole_run, 2), memory)
        steadies = ", ".join(f"{m} {cell(runs[variant, m].steady, '.2f')}" for m in MODES if (variant, m) in runs)
        notes.setdefault(setting, []).append(
            f"{variant}: steady {steadies}; {mode}: {cell(f.tflops, '.3g')} TFLOP/s in kernels, GPU busy "
            f"{cell(f.busy, '.0%')}, {cell(f.kernel_ms_per_update, '.0f')} kernel ms per update, "
            f"{cell(f.peak_memory_gib, '.1f')} GiB"
        )
    ppo = by_setting.get(("obs_action", 1), {}).get("ppo")
    if ppo is not None:  # PPO has no critic: the same run prices PPO with the one-pass critic's setting
        by_setting.get(("decoded_action", 1), {}).setdefault("ppo", ppo)
    measurements = [
        gpu_rates.Measurement(
            dtype=dtype,
            load_in_4bit=WEIGHTS[weights]["load_in_4bit"],
            dequantize_4bit=WEIGHTS[weights].get("dequantize_4bit", False),
            critic=critic,
            env_steps_per_s=speeds,
            ranks_per_gpu=ranks,
            device_name=device_name,
            date=datetime.date.today(),
            command=command,
            commit=commit(),
            torch=torch.__version__,
            transformers=transformers.__version__,
            notes=(
                f"{'One rank' if ranks == 1 else f'{ranks} ranks in one process'} of the paper's run at gpu_check's "
                "per-rank settings: 8 environments a rank; SAC-GLAM+HER, 2 updates of 64 a rank every 8 steps a rank, "
                "warm-up off; PPO-GLAM, 512-step rollouts of 16 epochs of 64; Flan-T5-base's shape with random "
                f"weights, LoRA, {weights_words(weights, dtype)}. Steady: SAC from the middle of its updating "
                "steps, PPO over the "
                f"rollout+update cycles after its first. {'; '.join(notes[critic, ranks])}."
            ),
        )
        for (critic, ranks), speeds in by_setting.items()
    ]
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
    parser.add_argument("--steps", type=positive, default=1088, help="environment steps measured in each run")
    parser.add_argument(
        "--profile-steps", type=positive, default=16, help="environment steps profiled after them on a GPU"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--modes", default="eager,captured,compiled", help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--rates", type=Path, help="the rates file to write (default: the budget's, for this GPU)")
    parser.add_argument("--json", type=Path, help="append each run's figures to this file as a JSON line")
    parser.add_argument("--small", action="store_true", help="PPO: 64-step rollouts of 2 epochs (CPU tests)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="model.dtype (auto: what a run on this GPU computes in); float16 measures a V100's dtype on another GPU",
    )
    parser.add_argument(
        "--weights",
        default="4bit",
        choices=list(WEIGHTS),
        help="the base weights: 4bit (the paper's), dequantized (its values dequantized once at load: "
        "model.dequantize_4bit) or dense (the model's own in the compute dtype); each one's rates beside the others",
    )
    add_threads_argument(parser)
    args = parser.parse_args()
    variants, modes = args.variants.split(","), args.modes.split(",")
    unknown = [v for v in variants if v not in VARIANTS] + [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown variants or modes: {unknown}")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("no CUDA device here; `--device cpu --model <tiny model>` checks the logic on a CPU")
    modes = modes if cuda else ["eager"]  # nothing is captured on a CPU
    rollout = (SMALL if args.small else VARIANTS["PPO-GLAM"])["ppo"]["rollout_steps"]
    if "PPO-GLAM" in variants and args.steps < 2 * rollout:  # a steady cycle after the first, which meets its graphs
        parser.error(f"--steps must be at least twice PPO's rollout of {rollout} steps: PPO's steady window is the "
                     "rollout+update cycles after its first")  # fmt: skip
    if cuda and args.profile_steps < 8:  # a step of the 8 environments
        parser.error("--profile-steps must be at least 8, one step of the 8 environments")
    pin_threads(args.threads)
    name = torch.cuda.get_device_name(args.device) if cuda else "CPU"
    try:
        rates_path, gpu, unwritten = rates_file(args, name)
    except ValueError as error:  # a bad calibration table or rates file: one line, before minutes of measuring
        print(f"error: {error}", file=sys.stderr)
        return 2
    failures: list[str] = []
    runs: dict[tuple[str, str], Figures] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or save_flan_t5_base_shaped(Path(tmp) / "flan-t5-base-shaped")
        dtype = DevicePlan.of_model(
            run_config(variants[0], model, args.device, "eager", 8, Path(tmp), args.small, args.dtype).model
        ).dtype
        print(f"gpu_check: {name}, torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s), model {model}")
        weights = weights_words(args.weights, dtype)
        setting = {"dtype": dtype, "weights": args.weights}  # each JSON line's: one file may gather several
        print(f"dtype {dtype}, {weights}, LoRA; modes {', '.join(modes)}\n\n{HEADER}")
        for variant in variants:
            envs = VARIANTS[variant].get("num_envs", 8)
            profiled = profiled_steps(args.profile_steps, envs) if cuda else 0
            # after the measured steps: the profiled ones, then the last step, which evaluates (a metrics row)
            total = args.steps + profiled + envs
            for mode in modes:
                out = Path(tmp) / f"{variant}-{mode}"
                config = run_config(variant, model, args.device, mode, total, out, args.small, args.dtype, args.weights)
                figures, failed = train(config, args.steps - args.steps % envs, profiled)
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
                failures += [f"{variant}, {mode}: {f}" for f in failed]
                if figures is not None:
                    runs[variant, mode] = figures
                    if args.json:
                        with args.json.open("a") as f:
                            f.write(json.dumps(setting | {"variant": variant, "mode": mode, **asdict(figures)}) + "\n")
                print(row(variant, mode, figures, failed), flush=True)
                if figures is not None and figures.kernels is not None:
                    print("  kernel time by kind:", *figures.kernels.lines(), sep="\n", flush=True)
    kernels = f"the {args.profile_steps} steps after them, in whole steps of the environments" if cuda else "no GPU"
    print(
        f"\nsteady: SAC from the middle of its updating steps, PPO over the rollout+update cycles after its first, "
        f"within the first {args.steps} steps; kernels: {kernels}; "
        f"a steady rate is clean where no graph is new in its window (each new one: eager calls, a capture and, "
        f"compiled, a compilation)"
    )
    if failures:
        print("rates not written: a check failed")
    elif rates_path is None:
        print(f"rates not written: {unwritten}; --rates FILE writes them")
    else:
        command = " ".join(["python -m sacglam_core.benchmarks.gpu_check", *sys.argv[1:]])
        write_rates(rates_path, gpu, name, dtype, runs, command, args.weights)
        budgets = "" if args.rates else f": the budget prices runs on {gpu} from it; commit it"
        print(f"rates written to {rates_path}{budgets}")
    print("\nFAILED: " + "; ".join(failures) if failures else "\nall checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
