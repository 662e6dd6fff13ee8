"""The CPU census of one rank's hot loop: what stands between it and passes a GPU replays from captured graphs.

    python -m sacglam_core.benchmarks.census [--model resources/models/tiny-t5] [--steps 320]

One SAC-GLAM+HER run at gpu_check's per-rank settings (8 environments, 2 updates of 64 every 8 steps, warm-up off,
LoRA), `--steps` environment steps on this CPU, and five figures:
- LLM stack forwards per SAC update (forward hooks on the encoder and decoder stacks): acting's share included, and
  the update's own;
- distinct input shapes per stack over the run, with and without gradients counted apart (a captured graph, or a
  compiled region, serves one shape);
- host reads of tensor values (`.item()`, `.tolist()`, `.numpy()`, value-dependent shapes) and tensors made from
  host data or copied from pageable host memory, inside an update (between its staging and its end);
- the share of matrix-product FLOPs computed in float32 when bf16 with 4-bit weights is asked (a policy
  forward+backward; `--precision` also prints it as loading did before, with peft's float32 upcast);
- graph breaks when each kind of LLM pass is traced whole by torch.compile (`torch._dynamo.explain`: a pass with none
  compiles with `fullgraph=True`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.benchmarks.flops import count_flops


def float32_matmul_share(
    model: str = "resources/models/tiny-t5", load_in_4bit: bool = True, dtype: str = "bfloat16", upcast: bool = False
) -> float:
    """The share of matrix-product FLOPs computed in float32 in one policy forward+backward (the sum of the log-probs
    of 6 environments' candidates) of `model` with LoRA on the CPU. `upcast`: with the frozen base weights that are
    not 4-bit cast to float32, as peft's `prepare_model_for_kbit_training` did in loading before."""
    from sacglam_core.agent import AgentConfig, CriticConfig, GlamAgent
    from sacglam_core.config import LoraSettings, ModelConfig
    from sacglam_core.envs import VectorPlayground
    from sacglam_core.envs.playground import ACTION_VOCABULARY

    if not Path(model).exists():
        from sacglam_core.tiny.build import build_tiny

        build_tiny(Path(model).parent)
    torch.manual_seed(0)
    config = ModelConfig(model, dtype=dtype, device="cpu", lora=LoraSettings(), load_in_4bit=load_in_4bit)
    agent = GlamAgent.from_config(AgentConfig(model=config, critic=CriticConfig()), ACTION_VOCABULARY)
    if upcast:
        for param in agent.lm.model.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.float()
    envs = VectorPlayground(6, seed=0)
    observations, infos = envs.reset()
    batch = agent.batch(infos["goal"], observations, infos["possible_actions"])

    def step() -> None:
        _, out = agent.policy(batch)
        out.action_logp.sum().backward()

    flops = count_flops(step)
    return flops.by_dtype.get(torch.float32, 0) / flops.total


VALUE_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2"}


class _HostTraffic(TorchDispatchMode):
    """Counts, while `inside`, the operators that read tensor values on the host or bring host data in."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.reads = self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inside:
            name = str(func.overloadpacket).replace(".", "::", 1)
            self.reads += name in VALUE_READS
            if name == "aten::lift_fresh":  # torch.tensor / as_tensor of host data
                self.copies += 1
            elif name in ("aten::_to_copy", "aten::copy_"):
                source = args[1] if name == "aten::copy_" else args[0]
                target = args[0].device if name == "aten::copy_" else kwargs.get("device", source.device)
                self.copies += (
                    source.device.type == "cpu" and torch.device(target).type != "cpu" and not source.is_pinned()
                )
        return func(*args, **kwargs)


@contextlib.contextmanager
def _counting_tensor_reads(traffic: _HostTraffic) -> Iterator[None]:
    """`tolist()` and `numpy()` read a tensor's values without the dispatcher: counted by hand."""
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def counted(original: Callable) -> Callable:
        def read(tensor, *args, **kwargs):
            traffic.reads += traffic.inside
            return original(tensor, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def loop_census(model: str, steps: int) -> dict:
    """Stack forwards, input shapes and host traffic of one SAC-GLAM+HER run at gpu_check's per-rank settings."""
    from sacglam_core.benchmarks.gpu_check import run_config
    from sacglam_core.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        config = run_config("SAC-GLAM+HER", Path(model), "cpu", "eager", steps, Path(tmp) / "run", small=False)
        static = dataclasses.replace(config.model, static_shapes=True)  # the GPU path's shapes, counted on the CPU
        trainer = Trainer(dataclasses.replace(config, model=static))
        agent = trainer.agent
        traffic = _HostTraffic()
        calls: Counter[tuple[str, str]] = Counter()  # (phase, stack)
        phase = ["other"]  # the update, acting in training, or the rest (the evaluation)
        shapes: dict[str, set] = {}
        base = agent.lm.model.get_base_model() if agent.lm.lora else agent.lm.model
        stacks = {"encoder": base.get_encoder(), "decoder": base.get_decoder()} if agent.lm.seq2seq else {
            "decoder": base.get_decoder()
        }  # fmt: skip

        def hook(name: str):
            def record(module, args, kwargs):
                ids = kwargs.get("input_ids", args[0] if args else None)
                memory = kwargs.get("encoder_hidden_states")
                shape = (tuple(ids.shape), None if memory is None else tuple(memory.shape), torch.is_grad_enabled())
                shapes.setdefault(name, set()).add(shape)
                calls["update" if traffic.inside else phase[0], name] += 1

            return record

        for name, stack in stacks.items():
            stack.register_forward_pre_hook(hook(name), with_kwargs=True)
        run = agent.graphs.run

        def marked(key, fn, inputs):
            def inside(tensors):
                traffic.inside = key[0] in ("sac", "sac-warmup")
                try:
                    return fn(tensors)
                finally:
                    traffic.inside = False

            return run(key, inside, inputs)

        agent.graphs.run = marked
        act = trainer.algo.act

        def acting(*args, **kwargs):
            phase[0] = "acting"
            try:
                return act(*args, **kwargs)
            finally:
                phase[0] = "other"

        trainer.algo.act = acting
        with traffic, _counting_tensor_reads(traffic):
            if trainer.run() != 0:
                raise RuntimeError("the census run did not finish")
        updates = trainer.algo.updates
    training = {name: calls["update", name] + calls["acting", name] for name in stacks}
    return {
        "updates": updates,
        "forwards": sum(training.values()) / updates,
        "update_forwards": sum(calls["update", name] for name in stacks) / updates,
        "per_stack": training,
        "shapes": {name: len(s) for name, s in shapes.items()},
        "reads": traffic.reads,
        "copies": traffic.copies,
    }


def graph_breaks(model: str) -> dict[str, int]:
    """Graph breaks of each kind of LLM pass traced whole by torch.compile, with and without gradients."""
    from sacglam_core.agent import AgentConfig, CriticConfig, GlamAgent
    from sacglam_core.config import LoraSettings, ModelConfig
    from sacglam_core.envs import VectorPlayground
    from sacglam_core.envs.playground import ACTION_VOCABULARY

    torch.manual_seed(0)
    config = AgentConfig(ModelConfig(model, lora=LoraSettings()), CriticConfig(hidden_units=32), max_candidates=8)
    agent = GlamAgent.from_config(config, ACTION_VOCABULARY)
    observations, infos = VectorPlayground(8, seed=0).reset()
    batch = agent.batch(infos["goal"], observations, infos["possible_actions"])
    passes = {
        "policy scores": lambda: agent.lm.score(batch).action_logp,
        "policy scores and hidden states": lambda: agent.lm.score(batch, hidden=True).action_hidden,
        "critic on prompt + action": lambda: agent.lm.concat_hidden(batch),
    }
    breaks = {}
    for name, fn in passes.items():
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                explained = torch._dynamo.explain(fn)()
            breaks[f"{name}, {'with' if grad else 'without'} gradients"] = explained.graph_break_count
            torch._dynamo.reset()
    return breaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/models/tiny-t5")
    parser.add_argument("--steps", type=int, default=320, help="environment steps of the census run")
    parser.add_argument("--precision", action="store_true", help="also the float32 share as loading was before")
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    if not Path(args.model).exists():
        from sacglam_core.tiny.build import build_tiny

        build_tiny(Path(args.model).parent)
    print(f"census: SAC-GLAM+HER at gpu_check's per-rank settings, {args.model}, LoRA, {args.steps} steps, CPU")
    loop = loop_census(args.model, args.steps)
    per_stack = ", ".join(f"{n} {c}" for n, c in loop["per_stack"].items())
    print(
        f"1. LLM stack forwards per SAC update: {loop['forwards']:.1f} with acting ({per_stack} in {loop['updates']} "
        f"updates and the steps between), {loop['update_forwards']:.1f} in the update itself"
    )
    shapes = ", ".join(f"{n} {c}" for n, c in loop["shapes"].items())
    print(f"2. distinct input shapes per stack, with and without gradients apart: {shapes}")
    print(
        f"3. inside updates: {loop['reads']} host reads, {loop['copies']} tensors made from host data or copied from "
        "pageable memory"
    )
    options = [("bf16, 4-bit", {})] + (
        [("bf16, 4-bit, peft's float32 upcast (before)", {"upcast": True})] if args.precision else []
    )
    for label, extra in options:
        print(f"4. matrix-product FLOPs in float32, {label}: {float32_matmul_share(args.model, **extra):.1%}")
    breaks = graph_breaks(args.model)
    print(f"5. graph breaks of each LLM pass traced whole: {sum(breaks.values())} in all")
    for name, count in breaks.items():
        print(f"   {name}: {count}")


if __name__ == "__main__":
    main()
