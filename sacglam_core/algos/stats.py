"""Training statistics between two metrics rows, kept as tensors until the row is written: reading a
GPU tensor's value at every update would make the update wait for the GPU."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


class UpdateStats:
    def __init__(self) -> None:
        self._values: dict[str, list[torch.Tensor | float]] = defaultdict(list)
        self._shown: dict[str, int] = {}  # values already returned by `unseen`, per statistic

    def add(self, **values: torch.Tensor | float) -> None:
        for key, value in values.items():
            self._values[key].append(value.detach() if isinstance(value, torch.Tensor) else value)

    def pop(self) -> dict[str, float]:
        """The mean of each statistic since the last call."""
        means = {k: float(np.mean([float(x) for x in v])) for k, v in self._values.items() if v}
        self._values.clear()
        self._shown.clear()
        return means

    def unseen(self) -> dict[str, float]:
        """The mean of each statistic added since the last `unseen` or `pop`, leaving the values to `pop` (the
        monitor's scalars, read between two metrics rows)."""
        means = {
            k: float(np.mean([float(x) for x in v[self._shown.get(k, 0) :]]))
            for k, v in self._values.items()
            if len(v) > self._shown.get(k, 0)
        }
        self._shown = {k: len(v) for k, v in self._values.items()}
        return means

    def state_dict(self) -> dict[str, dict]:
        return {"values": {k: [float(x) for x in v] for k, v in self._values.items()}, "shown": dict(self._shown)}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        if "shown" not in state:  # a checkpoint from before `shown` was kept holds the values alone
            state = {"values": state, "shown": {k: len(v) for k, v in state.items()}}
        self._values = defaultdict(list, {k: list(v) for k, v in state["values"].items()})
        self._shown = dict(state["shown"])
