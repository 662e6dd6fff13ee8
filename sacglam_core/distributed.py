"""Data parallelism: a run's data-parallel ranks, held by the processes of one job (torchrun conventions: RANK,
WORLD_SIZE, LOCAL_RANK).

Each rank runs its share of the environments, with its own replay buffer and random streams (the paper's 4 LLM
instances, 8 environments and batches of 64 each). A process holds `per_process` of them (`RunConfig.ranks`):
one by default, one process per GPU; or several, whose batches it runs together in the same passes, so that the
paper's four ranks fit on one GPU. After every backward pass the gradients are averaged across processes, so their
copies of the LLM stay identical; within a process, each rank's loss is a mean over its own rows and the process's
loss their mean, which is what averaging over the ranks gives. The all-reduce of an optimizer step's gradients is
one flat bucket; where updates are replayed from captured CUDA graphs it runs between the graphs' pieces, never
inside one (`outside_graphs`), so the same code runs over nccl or gloo, captured or eager.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from sacglam_core.config import ConfigError
from sacglam_core.device_plan import DevicePlan

Collective = Callable[[], object]
_handler: ContextVar[Callable[[Collective], None] | None] = ContextVar("collectives", default=None)


def outside_graphs(collective: Collective) -> None:
    """Run a collective now, or, while a CUDA graph is being captured, between two of its pieces (agent/static.py):
    a collective is never recorded inside a graph, whatever the backend (gloo cannot be captured; processes meet a
    new shape, and capture, at different updates)."""
    handler = _handler.get()
    if handler is None:
        collective()
    else:
        handler(collective)


@contextmanager
def collectives_to(handler: Callable[[Collective], None]) -> Iterator[None]:
    """Hand the collectives that code inside the block starts (`outside_graphs`) to `handler`."""
    token = _handler.set(handler)
    try:
        yield
    finally:
        _handler.reset(token)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # this process
    world: int = 1  # processes
    local_rank: int = 0
    device: str = "cpu"  # where collective tensors live: the GPU with nccl
    per_process: int = 1  # data-parallel ranks held by each process
    # Each parameter list's flat gradient bucket, allocated at its first (eager) all-reduce and reused by every later
    # one, captured or not: no captured graph holds a bucket of its own.
    buckets: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def total(self) -> int:
        """The run's data-parallel ranks."""
        return self.world * self.per_process

    @property
    def held(self) -> range:
        """The data-parallel ranks this process holds."""
        return range(self.rank * self.per_process, (self.rank + 1) * self.per_process)

    def share(self, total: int, rank: int) -> int:
        """Data-parallel rank `rank`'s part of `total` split over the ranks: total // ranks, and one more on each of
        the first total % ranks ranks, so that the parts add up to `total`."""
        return total // self.total + int(rank < total % self.total)

    def holding(self, ranks: int | None) -> Ranks:
        """These processes holding a run of `ranks` data-parallel ranks (None: one per process)."""
        ranks = ranks or self.world
        if ranks % self.world:
            raise ConfigError(f"ranks={ranks} cannot be shared out evenly among {self.world} processes")
        return dataclasses.replace(self, per_process=ranks // self.world)

    def average_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """All-reduce (mean) the gradients of `params`; a missing gradient counts as zero."""
        if not self.active or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        bucket = self.buckets.get(key := tuple(map(id, params)))
        if bucket is None:
            dtype = functools.reduce(torch.promote_types, (p.dtype for p in params))
            size = sum(p.numel() for p in params)
            bucket = self.buckets[key] = torch.empty(size, dtype=dtype, device=params[0].device)
        torch.cat([g.reshape(-1) for g in grads], out=bucket)  # one bucket: one collective per optimizer step
        outside_graphs(lambda: dist.all_reduce(bucket))
        bucket /= self.world
        offset = 0
        for p, g in zip(params, grads):
            p.grad = bucket[offset : offset + g.numel()].view_as(g).to(p.dtype)
            offset += g.numel()

    def sum(self, values: list[float]) -> list[float]:
        if not self.active:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def all(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank."""
        return self.sum([float(flag)])[0] == self.world if self.active else flag

    def any(self, flag: bool) -> bool:
        return self.sum([float(flag)])[0] > 0 if self.active else flag

    def gather(self, value: float) -> list[float]:
        if not self.active:
            return [value]
        out = [torch.zeros(1, dtype=torch.float64, device=self.device) for _ in range(self.world)]
        dist.all_gather(out, torch.tensor([value], dtype=torch.float64, device=self.device))
        return [float(t) for t in out]

    def gather_strings(self, value: str) -> list[str]:
        if not self.active:
            return [value]
        out: list[str] = [""] * self.world
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def init_ranks(plan: DevicePlan) -> Ranks:
    """Join the process group that torchrun (or submitit's distributed environment) describes, on the plan's device
    and backend."""
    if plan.processes == 1:
        return Ranks()
    if plan.device.startswith("cuda"):
        torch.cuda.set_device(plan.device)
    if not dist.is_initialized():
        dist.init_process_group(backend=plan.backend)
    # Host values (flags, statistics) travel as tensors on the backend's own side: the GPU for nccl, the CPU for gloo.
    flags = plan.device if plan.backend == "nccl" else "cpu"
    return Ranks(int(os.environ["RANK"]), plan.processes, int(os.environ.get("LOCAL_RANK", "0")), flags)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
