"""Where one rank's environment steps and updates spend their time, by phase: host time, torch operator calls and
host reads of tensor values, at gpu_check's per-rank settings (8 environments; SAC: updates of 64 twice every 8
steps; PPO: 512 steps, 16 epochs of 64), LoRA, warm-up off.

    python -m sacglam_core.benchmarks.hot_loop --model resources/models/tiny-t5     # the CPU, the tiny T5
    python -m sacglam_core.benchmarks.hot_loop --device cuda                        # Flan-T5-base's shape

After `--warmup-steps` environment steps (SAC's buffer then holds batches and every cycle updates) it times
`--steps` steps, then runs as many under torch.profiler to count operator calls, then, on a GPU, profiles
`--busy-steps` steps for the GPU's kernel time. Phases nest; each one's figures are its own, without the phases
inside it.

Operator calls are the outermost `aten::` events of torch.profiler: each call into torch's dispatcher from Python or
from the autograd engine, which costs the host time whatever the tensor's size (calls an operator makes inside
itself are its implementation: on a CPU, `_foreach_*` and fused Adam loop over their tensors there, where a GPU runs
one kernel). Host reads are what a GPU run must wait for: `.item()` (`float(t)`, `bool(t)`), `tolist()` and
`numpy()` of a tensor, and operators whose output size depends on values (`nonzero`...). On a CPU they are counted
all the same: a tensor the loop reads there is one that a GPU would hand back.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.config import RunConfig, parse_config
from sacglam_core.trainer import Trainer

VALUE_DEPENDENT = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2"}
OUTSIDE = "the loop's own Python"
UPDATE = "update: losses, statistics, the rest"
LOOP = {  # what an environment step does besides its updates
    "environment step",
    "episode recording",
    "acting: sampling, choices",
    "replay: adding episodes and hindsight copies",
    "monitoring",
    OUTSIDE,
}


class Phases:
    """Names the phases of the loop as the profiler's ranges, and times each one's own host time while `timing`."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.mark = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.names: set[str] = set()
        self.reads: Counter[str] = Counter()
        self.timing = False

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else OUTSIDE

    def lap(self) -> None:
        now = time.perf_counter()
        if self.timing:
            self.seconds[self.current] += now - self.mark
        self.mark = now

    @contextlib.contextmanager
    def phase(self, name: str):
        self.lap()
        self.stack.append(name)
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            self.lap()
            self.stack.pop()

    def wrap(self, owner, attribute: str, name: str) -> None:
        """Run `owner.attribute` (a method, or a module's function) as phase `name` from now on."""
        original = getattr(owner, attribute)
        self.names.add(name)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def instrument(trainer: Trainer, phases: Phases) -> None:
    """Name the phases of the loop: the methods an environment step and an update go through."""
    algo, agent = trainer.algo, trainer.agent
    named = [
        (trainer.envs, "step", "environment step"),
        (trainer.recorder, "step", "episode recording"),
        (trainer.recorder, "prompts", "episode recording"),
        (trainer.recorder, "candidates", "episode recording"),
        (agent, "batch_from_ids", "batches: token ids"),
        (agent.lm, "collate", "batches: padding, copies to the device"),
        (algo, "act", "acting: sampling, choices"),
        (algo, "add", "replay: adding episodes and hindsight copies"),
        (algo, "update", UPDATE),
        (agent.lm, "score", "LLM pass: policy scores"),
        (agent.lm, "concat_hidden", "LLM pass: critic on prompt + action"),
        (torch.autograd, "backward", "backward passes"),
        (torch.nn.utils, "clip_grad_norm_", "gradient clipping"),
        (trainer.monitor, "scalars", "monitoring"),
        (trainer.monitor, "progress", "monitoring"),
    ]
    if hasattr(algo, "buffer"):
        named += [
            (algo.buffer, "sample", "replay: sampling"),
            (algo.buffer, "rows", "replay: reading rows"),
            (agent.critic, "update_target", "target update (Polyak)"),
        ]
    for attribute in ("actor_optimizer", "critic_optimizer", "alpha_optimizer", "optimizer"):
        if hasattr(algo, attribute):
            named.append((getattr(algo, attribute), "step", "optimizer steps (Adam)"))
    for owner, attribute, name in named:
        phases.wrap(owner, attribute, name)


@contextlib.contextmanager
def counting_tensor_reads(phases: Phases):
    """`tolist()` and `numpy()` of a tensor count as host reads: they read its values without the dispatcher."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def counted(original: Callable):
        def read(tensor, *args, **kwargs):
            phases.reads[phases.current] += 1
            return original(tensor, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@dataclass
class Window:
    name: str
    start: int  # environment steps
    end: int
    wall: float = 0.0
    updates: int = 0
    profile: object = None


@dataclass
class Measurement:
    config: RunConfig
    windows: dict[str, Window]
    seconds: dict[str, float]  # each phase's own host time in the timing window
    ops: Counter = field(default_factory=Counter)  # operator calls per phase in the counting window
    reads: Counter = field(default_factory=Counter)  # host reads per phase in the counting window


def measure(config: RunConfig, warmup: int, steps: int, busy_steps: int) -> Measurement:
    """Train `config` and measure its loop in windows of environment steps: timing, counting and, on a GPU, busy."""
    trainer = Trainer(config)
    cuda = trainer.agent.lm.device.type == "cuda"
    phases = Phases()
    windows, start = {}, warmup
    for name, length in [("timing", steps), ("counting", steps), *([("busy", busy_steps)] if cuda else [])]:
        windows[name] = Window(name, start, start + length)
        start += length
    open_window: list = []  # (window, ExitStack, wall-clock start, updates at start)
    original_step = trainer._step

    def begin(window: Window) -> None:
        if not phases.names:
            instrument(trainer, phases)
        stack = contextlib.ExitStack()
        if window.name == "counting":
            window.profile = stack.enter_context(
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            )
            stack.enter_context(counting_tensor_reads(phases))
        elif window.name == "busy":
            window.profile = stack.enter_context(
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            )
        if cuda:
            torch.cuda.synchronize()
        phases.timing, phases.mark = window.name == "timing", time.perf_counter()
        open_window.append((window, stack, time.perf_counter(), trainer.algo.updates))

    def end() -> None:
        window, stack, started, updates = open_window.pop()
        if cuda:
            torch.cuda.synchronize()
        window.wall, window.updates = time.perf_counter() - started, trainer.algo.updates - updates
        phases.timing = False
        stack.close()

    def stepped(started: float) -> None:
        due = next((w for w in windows.values() if w.start <= trainer.env_steps < w.end), None)
        if open_window and open_window[0][0] is not due:
            end()
        if due is not None and not open_window:
            begin(due)
        original_step(started)

    trainer._step = stepped
    if trainer.run() != 0:
        raise RuntimeError("the measured run did not finish")
    if open_window:
        end()
    measurement = Measurement(config, windows, dict(phases.seconds))
    for event in windows["counting"].profile.events():
        if not event.name.startswith("aten::"):
            continue
        outermost = event
        while outermost.cpu_parent is not None and outermost.cpu_parent.name.startswith("aten::"):
            outermost = outermost.cpu_parent
        parent = outermost.cpu_parent
        while parent is not None and parent.name not in phases.names:
            parent = parent.cpu_parent
        phase = parent.name if parent is not None else OUTSIDE
        if outermost is event:
            measurement.ops[phase] += 1
        if event.name in VALUE_DEPENDENT and outermost.name in {"aten::item", "aten::is_nonzero", event.name}:
            measurement.reads[phase] += 1
    measurement.reads.update(phases.reads)
    return measurement


def report(m: Measurement) -> str:
    timing, counting = m.windows["timing"], m.windows["counting"]
    envs = m.config.num_envs
    vector_steps = (timing.end - timing.start) // envs
    counted_steps = counting.end - counting.start
    per_update = max(counting.updates, 1)
    names = sorted(set(m.seconds) | set(m.ops), key=lambda n: -m.seconds.get(n, 0))
    out = [
        f"timing: {timing.end - timing.start} environment steps ({vector_steps} steps of {envs} environments, "
        f"{timing.updates} updates) in {timing.wall:.2f} s: {(timing.end - timing.start) / timing.wall:.2f} "
        f"environment steps/s",
        "| phase | host ms per step of the environments | share | operator calls per update | host reads per "
        "environment step |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in names:
        seconds = m.seconds.get(name, 0.0)
        out.append(
            f"| {name} | {1e3 * seconds / vector_steps:.1f} | {100 * seconds / timing.wall:.1f}% "
            f"| {m.ops[name] / per_update:,.0f} | {m.reads[name] / counted_steps:.2f} |"
        )
    updating = sum(n for name, n in m.ops.items() if name not in LOOP)
    out += [
        f"operator calls per update: {updating / per_update:,.0f} ({sum(m.ops.values()) / per_update:,.0f} with "
        f"acting and the rest of the loop), over {counting.updates} updates",
        f"host reads per environment step: {sum(m.reads.values()) / counted_steps:.2f}, over {counted_steps} "
        "environment steps",
    ]
    busy = m.windows.get("busy")
    if busy is not None:
        kernels = sum(
            e.self_device_time_total
            for e in busy.profile.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA
        )
        out.append(
            f"GPU busy {100 * kernels / 1e6 / busy.wall:.0f}% of {busy.wall:.2f} s ({busy.end - busy.start} "
            f"environment steps, kernel time {kernels / 1e6:.2f} s)"
        )
    return "\n".join(out)


def settings(
    variant: str, model: Path, device: str, steps: int, out: Path, critic: str, four_bit: bool, compiled: bool
) -> dict:
    """gpu_check's per-rank run of `variant`, warm-up off, with nothing but the loop on the way: no evaluation,
    checkpoint or TensorBoard, the monitor's reads as rare as in a paper run."""
    from sacglam_core.benchmarks.gpu_check import PER_RANK

    per_rank = PER_RANK[variant]
    if per_rank["algorithm"] == "sac":
        per_rank = {**per_rank, "sac": {**per_rank["sac"], "warmup_cycles": 0, "critic": {"input": critic}}}
    return {
        **per_rank,
        "model": {
            "name_or_path": str(model),
            "device": device,
            "lora": {},
            "load_in_4bit": four_bit,
            **({"compile": True} if compiled else {}),  # left out otherwise: the loop before it existed runs too
        },
        "output_dir": str(out),
        "num_envs": 8,
        "total_steps": steps,
        "threads": torch.get_num_threads(),
        "eval": {"every_steps": 10**9, "episodes_per_type": 1, "test_episodes": 1},
        "checkpoint": {"every_updates": 10**9},
        # a 400K-step run's cadence: training scalars every 2,000 steps, progress lines every 8,000
        "monitor": {"tensorboard": False, "scalars_every_steps": 2000, "progress_every_steps": 8000},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", type=Path, help="a model folder (default: a Flan-T5-base-shaped one, built here)")
    parser.add_argument("--variant", default="SAC-GLAM+HER", choices=["SAC-GLAM+HER", "PPO-GLAM"])
    parser.add_argument("--critic", default="obs_action", choices=["obs_action", "decoded_action"])
    parser.add_argument("--4bit", dest="four_bit", action="store_true", help="4-bit weights (QLoRA)")
    parser.add_argument("--compile", action="store_true", help="model.compile: the transformer stacks compiled")
    parser.add_argument("--warmup-steps", type=positive, default=160, help="environment steps before measuring")
    parser.add_argument("--steps", type=positive, default=64, help="environment steps timed, then counted")
    parser.add_argument("--busy-steps", type=positive, default=16, help="environment steps profiled on a GPU")
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from sacglam_core.models.shapes import save_flan_t5_base_shaped

            model = save_flan_t5_base_shaped(Path(tmp) / "flan-t5-base-shaped")
        total = args.warmup_steps + 2 * args.steps + args.busy_steps + 8  # past the windows: they all close
        out = Path(tmp) / "run"
        raw = settings(args.variant, model, args.device, total, out, args.critic, args.four_bit, args.compile)
        config = parse_config(raw)
        print(
            f"hot_loop: {args.variant}, critic {args.critic}, {model}, {args.device}, 4-bit weights {args.four_bit}, "
            f"compiled {args.compile}"
        )
        print(report(measure(config, args.warmup_steps, args.steps, args.busy_steps)))


if __name__ == "__main__":
    main()
