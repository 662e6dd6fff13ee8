"""Data parallelism: a run's data-parallel ranks, held by the processes of one job (torchrun conventions: RANK,
WORLD_SIZE, LOCAL_RANK).

Each rank runs its share of the environments, with its own replay buffer and random streams (the paper's 4 LLM
instances, 8 environments and batches of 64 each). A process holds `per_process` of them (`RunConfig.ranks`):
one by default, one process per GPU; or several, whose batches it runs together in the same passes, so that the
paper's four ranks fit on one GPU. After every backward pass the gradients are averaged across processes, so their
copies of the LLM stay identical; within a process, each rank's loss is a mean over its own rows and the process's
loss their mean, which is what averaging over the ranks gives.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sacglam_core.config import ConfigError


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # this process
    world: int = 1  # processes
    local_rank: int = 0
    device: str = "cpu"  # where collective tensors live: the GPU with nccl
    per_process: int = 1  # data-parallel ranks held by each process

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
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).to(p.dtype)
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


def local_gpu(local_rank: int, visible: int) -> int:
    """This rank's GPU among the `visible` ones: its local rank when each task sees all of the node's GPUs,
    0 when SLURM binds one GPU to each task (--gpus-per-task, --gpu-bind)."""
    return local_rank % max(visible, 1)


def init_ranks() -> Ranks:
    """Join the process group that torchrun (or submitit's distributed environment) describes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = torch.cuda.is_available()
    device = "cpu"
    if gpu:
        device = f"cuda:{local_gpu(local_rank, torch.cuda.device_count())}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if gpu else "gloo")
    return Ranks(int(os.environ["RANK"]), world, local_rank, device)


def resolve_device(requested: str, ranks: Ranks) -> str:
    """The device of this rank's model; a CUDA device this machine does not have is a ConfigError."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and ranks.device.startswith("cuda"):
        requested = ranks.device
    if requested.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(requested.partition(":")[2] or 0)
        if index >= count:
            raise ConfigError(
                f"model.device: {requested} is not available: this machine has "
                f"{f'{count} CUDA devices' if count else 'no CUDA device'} (torch.cuda.is_available() is "
                f"{torch.cuda.is_available()}); use device: cpu or auto"
            )
    return requested


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
