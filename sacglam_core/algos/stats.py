"""Training statistics between two metrics rows, kept as tensors until the row is written: reading a
GPU tensor's value at every update would make the update wait for the GPU."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from sacglam_core.distributed import Ranks

MAXED = ("policy_kl", "policy_kl_state_max")  # statistics whose largest value in a window is a row of its own
MAXIMA = tuple(f"{name}_max" for name in MAXED)  # those rows: the largest over processes, where the others average


class UpdateStats:
    def __init__(self) -> None:
        self._values: dict[str, list[torch.Tensor | float]] = defaultdict(list)
        self._shown: dict[str, int] = {}  # values already returned by `unseen`, per statistic

    def add(self, **values: torch.Tensor | float) -> None:
        """A scalar per statistic, or a vector of several measurements (one per rank this process holds)."""
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                self._values[key].extend(value.detach().reshape(-1).unbind(0))
            else:
                self._values[key].append(value)

    def pop(self) -> dict[str, float]:
        """The mean of each statistic since the last call (and for MAXED ones, `<name>_max`, the largest)."""
        read = _read(self._values)
        means = {k: float(np.mean(v)) for k, v in read.items() if v}
        means |= {m: float(np.max(read[k])) for k, m in zip(MAXED, MAXIMA) if read.get(k)}
        self._values.clear()
        self._shown.clear()
        return means

    def unseen(self) -> dict[str, float]:
        """The mean of each statistic added since the last `unseen` or `pop`, leaving the values to `pop` (the
        monitor's scalars, read between two metrics rows)."""
        fresh = {k: v[self._shown.get(k, 0) :] for k, v in self._values.items()}
        means = {k: float(np.mean(v)) for k, v in _read(fresh).items() if v}
        self._shown = {k: len(v) for k, v in self._values.items()}
        return means

    def state_dict(self) -> dict[str, dict]:
        return {"values": _read(self._values), "shown": dict(self._shown)}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        self._values = defaultdict(list, {k: list(v) for k, v in state["values"].items()})
        self._shown = dict(state["shown"])


def skipped_warning(share: float) -> str:
    return (
        f"the float16 loss scaler skipped {share:.0%} of the optimizer steps since the last metrics row (their "
        "gradients overflowed float16): use bfloat16 where the GPU has it, or lower learning rates (docs/trainer.md)"
    )


def across_processes(stats: dict[str, float], ranks: Ranks) -> dict[str, float]:
    """Each process's statistics (over its ranks) as one row: their mean over the processes, and for the MAXIMA the
    largest of any."""
    maxima = {k: max(ranks.gather(v)) for k, v in stats.items() if k in MAXIMA}
    means = ranks.sum(list(stats.values()))
    return {k: type(v)(m / ranks.world) for (k, v), m in zip(stats.items(), means)} | maxima


def _read(values: dict[str, list[torch.Tensor | float]]) -> dict[str, list[float]]:
    """The values as floats, the tensors among them read from the device in one transfer."""
    tensors = [x for v in values.values() for x in v if isinstance(x, torch.Tensor)]
    read = iter(torch.stack([t.double() for t in tensors]).tolist() if tensors else [])
    return {k: [next(read) if isinstance(x, torch.Tensor) else float(x) for x in v] for k, v in values.items()}


class Diverged(RuntimeError):
    """Training produced a non-finite loss, gradient or weight; the message says which, and where."""


class Health:
    """Whether the updates' losses and gradient norms stay finite, recorded on the device inside each (captured)
    update and read where the loop reads anyway (its training statistics, a checkpoint): the first update and
    environment step at which each went non-finite. float16's loss scaler skipping a step whose gradients
    overflowed is not divergence: those steps are counted apart."""

    def __init__(self, names: tuple[str, ...], device: torch.device | str, unit: str = "update") -> None:
        self.names, self.unit = names, unit  # `unit`: what the updates are (PPO counts its minibatch steps)
        # per name, (update, environment step, value) where it first went non-finite; -1 while it has not
        self.first = torch.full((len(names), 3), -1.0, dtype=torch.float64, device=device)
        self.update = torch.zeros((), dtype=torch.float64, device=device)  # updates done, counted on the device
        self.steps = torch.zeros((), dtype=torch.float64, device=device)  # optimizer steps, taken or skipped
        self.skipped = torch.zeros((), dtype=torch.float64, device=device)  # float16 steps the scaler skipped

    def record(self, env_steps: torch.Tensor, **values: torch.Tensor) -> None:
        """Inside an update: note each scalar of `values` (named by `names`) that is not finite, if it is the first."""
        for index, name in enumerate(self.names):
            if name in values:
                value = values[name].detach().to(self.first.dtype)
                where = torch.stack([self.update, env_steps.to(self.first.dtype), value])
                first = self.first[index]
                self.first[index] = torch.where(~torch.isfinite(value) & (first[0] < 0), where, first)

    def stepped(self, skipped: torch.Tensor) -> None:
        """An optimizer step was taken, or skipped by float16's scaler (`skipped` 1)."""
        self.steps += 1
        self.skipped += skipped

    def skipped_share(self, since: tuple[float, float]) -> tuple[float, tuple[float, float]]:
        """The share of optimizer steps float16's scaler skipped since the (steps, skipped) `since`, and the counts
        now: one read."""
        steps, skipped = torch.stack([self.steps, self.skipped]).tolist()
        taken = steps - since[0]
        return ((skipped - since[1]) / taken if taken else 0.0), (steps, skipped)

    def finish_update(self) -> None:
        self.update += 1

    def start_at(self, updates: int) -> None:
        """After a resume: the device's count of updates continues from the checkpoint's."""
        self.update.fill_(updates)

    def divergence(self) -> tuple[str, int, int] | None:
        """(what went non-finite and to what, at which update, at which environment step) of the earliest, or None:
        one read."""
        first = self.first.cpu().tolist()
        bad = [(int(u), int(s), f"{name} {v}") for name, (u, s, v) in zip(self.names, first) if u >= 0]
        if not bad:
            return None
        update, step, _ = min(bad)
        return ", ".join(what for u, _, what in bad if u == update), update, step
