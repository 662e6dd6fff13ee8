"""The device plan: how a run computes on its device, decided once, at start.

`DevicePlan.of_run` resolves, from the run's settings, its processes and the device, everything that depends on the
hardware: the device, the compute dtype and loss scaling, static shapes, captured CUDA graphs, compiled blocks, the
process group's backend and where its collectives run. The trainer prints it in one line, done.json records it and
`status --report` shows it; the process group, the agent and the algorithms read it and decide none of it again.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

import torch

from sacglam_core.config import ConfigError, ModelConfig, RunConfig

AMPERE = (8, 0)  # compute capability from which GPUs have bfloat16 and TF32 tensor cores (the A100, sm_80)

Backend = Literal["auto", "nccl", "gloo"]
Collectives = Literal["none", "in the update", "between graphs"]


@dataclass(frozen=True)
class DevicePlan:
    device: str
    """`cpu` or `cuda:<n>`: this process's device."""
    gpu: str | None
    """The GPU's name (None on a CPU)."""
    capability: tuple[int, int] | None
    """The GPU's compute capability (None on a CPU)."""
    dtype: str
    """The LLM's compute dtype."""
    loss_scaling: bool
    """float16: each optimizer's loss goes through a GradScaler (the trained weights stay float32)."""
    static_shapes: bool
    """Batches in a few fixed shapes (agent/batch.py), which captured graphs and compiled blocks need."""
    capture: bool
    """Passes and updates replayed from captured CUDA graphs (agent/static.py)."""
    compile: bool
    """Transformer blocks compiled by torch.compile."""
    processes: int
    """Processes of the run (torchrun's WORLD_SIZE)."""
    backend: str | None
    """The process group's backend (None with one process)."""
    collectives: Collectives
    """Where an update's gradient all-reduces run: `none` (one process), `in the update` (eager passes), `between
    graphs` (each update's captured pieces replayed around them: a collective is never recorded in a graph)."""
    host_reads_checked: bool = False
    """The first calls of each device-only function fail on a host read (`model.check_host_reads`; on a CPU not
    with compiled blocks, which torch.compile cannot trace under the check's dispatch mode)."""
    tf32: bool = False
    """float32 matrix products on TF32 tensor cores (`model.tf32`, on a GPU of compute capability 8.0 or later)."""

    @classmethod
    def of_run(cls, config: RunConfig) -> DevicePlan:
        """The plan of this process of a run started by torchrun (or alone: WORLD_SIZE unset)."""
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        return cls.of_model(config.model, processes, int(os.environ.get("LOCAL_RANK", "0")), config.backend)

    @classmethod
    def of_model(
        cls, model: ModelConfig, processes: int = 1, local_rank: int = 0, backend: Backend = "auto"
    ) -> DevicePlan:
        """The plan of one of `processes` processes, the `local_rank`-th of its node."""
        device = resolve_device(model.device, local_rank)
        gpu = device.startswith("cuda")
        capability = tuple(torch.cuda.get_device_capability(device)) if gpu else None
        dtype = model.compute_dtype(capability)
        if gpu and dtype == "bfloat16" and capability < AMPERE:
            raise ConfigError(
                f"model.dtype: bfloat16 needs a GPU of compute capability 8.0 or later; {device} is "
                f"sm_{capability[0]}{capability[1]}: use auto (float16 with loss scaling there) or float32"
            )
        static = gpu if model.static_shapes == "auto" else model.static_shapes
        capture = model.capture and gpu and static  # a graph per shape of every batch would never stop capturing
        compile_ = model.compile is True or (model.compile == "auto" and capture and _triton_supports(device))
        if processes > 1 and backend == "nccl" and not gpu:
            raise ConfigError(f"backend: nccl needs a GPU; this process computes on {device} (use auto or gloo)")
        if processes > 1:  # several processes on one GPU need gloo: NCCL refuses them ("Duplicate GPU detected")
            backend = ("nccl" if gpu else "gloo") if backend == "auto" else backend
        collectives = "none" if processes == 1 else "between graphs" if capture else "in the update"
        return cls(
            device,
            torch.cuda.get_device_name(device) if gpu else None,
            capability,
            dtype,
            dtype == "float16",
            static,
            capture,
            compile_,
            processes,
            backend if processes > 1 else None,
            collectives,
            # the CPU's check is a dispatch mode, which torch.compile refuses to trace under ("non-infra torch
            # dispatch mode present, this is not supported today"): compiled CPU blocks go unchecked
            model.check_host_reads and (gpu or not compile_),
            gpu and model.tf32 and capability >= AMPERE,
        )

    @classmethod
    def eager(cls, device: str, static_shapes: bool = False) -> DevicePlan:
        """An eager float32 process of its own on `device`: an agent built without a run (tests, FLOP counts)."""
        return cls(device, None, None, "float32", False, static_shapes, False, False, 1, None, "none")

    @property
    def line(self) -> str:
        """The plan in one line, as the trainer prints it at start."""
        return f"device plan: {self.summary}"

    @property
    def summary(self) -> str:
        where = f"{self.device} ({self.gpu}, sm_{self.capability[0]}{self.capability[1]})" if self.gpu else self.device
        parts = [
            where,
            self.dtype + (" with loss scaling" if self.loss_scaling else ""),
            "static shapes" if self.static_shapes else "shapes per batch",
            "captured" if self.capture else "eager",
            "compiled" if self.compile else "not compiled",
        ]
        if self.gpu and self.capability >= AMPERE:
            parts.append("TF32 products" if self.tf32 else "float32 products without TF32")
        processes = (
            "one process"
            if self.processes == 1
            else f"{self.processes} processes over {self.backend}, collectives {self.collectives}"
        )
        return f"{', '.join(parts)}; {processes}"

    def record(self) -> dict:
        """The plan as done.json keeps it (`summary`: the line `status` shows)."""
        return dataclasses.asdict(self) | {"summary": self.summary}

    def for_model(self, model: ModelConfig) -> ModelConfig:
        """`model` on this plan's device and dtype, as the loader reads it."""
        return dataclasses.replace(model, device=self.device, dtype=self.dtype, tf32=self.tf32)


def _triton_supports(device: str) -> bool:
    """Whether torch.compile can compile for this GPU: torch's own rule (torch/utils/_triton.py `has_triton`: Triton
    installed and compute capability 7.0 or later, so a V100, sm_70, compiles)."""
    from torch.utils._triton import has_triton

    with torch.cuda.device(device):
        return has_triton()


def local_gpu(local_rank: int, visible: int) -> int:
    """This rank's GPU among the `visible` ones: its local rank when each task sees all of the node's GPUs,
    0 when SLURM binds one GPU to each task (--gpus-per-task, --gpu-bind)."""
    return local_rank % max(visible, 1)


def resolve_device(requested: str, local_rank: int = 0) -> str:
    """The device of this process's model (`cuda` is its own GPU); a CUDA device this machine does not have is a
    ConfigError."""
    available = torch.cuda.is_available()
    if requested == "auto":
        requested = "cuda" if available else "cpu"
    if not requested.startswith("cuda"):
        return requested
    count = torch.cuda.device_count() if available else 0
    if requested == "cuda" and count:
        requested = f"cuda:{local_gpu(local_rank, count)}"
    index = int(requested.partition(":")[2] or 0)
    if index >= count:
        raise ConfigError(
            f"model.device: {requested} is not available: this machine has "
            f"{f'{count} CUDA devices' if count else 'no CUDA device'} (torch.cuda.is_available() is {available}); "
            f"use device: cpu or auto"
        )
    return requested
