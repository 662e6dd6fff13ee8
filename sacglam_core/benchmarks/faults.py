"""Faults injected on the device, so that a captured graph replays them: what the GPU verification and the tests use to
show that float16's loss scaler skips a step and recovers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from sacglam_core.algos import ppo, precision, sac


class ForcedOverflow:
    """While armed, every step of `optimizer` sees an infinite gradient: a device tensor added to its first gradient
    before the step, so a captured update replays it (arm and disarm between replays). The losses stay finite: what a
    float16 overflow of the backward pass looks like to the scaler."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
        self.optimizer = optimizer
        self.poison = torch.zeros((), device=device)

    def arm(self) -> None:
        self.poison.fill_(math.inf)

    def disarm(self) -> None:
        self.poison.zero_()

    @contextmanager
    def installed(self) -> Iterator[ForcedOverflow]:
        """The algorithms' steps go through the fault while the block runs (build and capture inside it)."""

        def poisoned(optimizer, scaler, params, max_norm):
            if optimizer is self.optimizer:
                next(p.grad for p in params if p.grad is not None).add_(self.poison)
            return precision.step(optimizer, scaler, params, max_norm)

        previous = sac.step, ppo.step
        sac.step = ppo.step = poisoned
        try:
            yield self
        finally:
            sac.step, ppo.step = previous
