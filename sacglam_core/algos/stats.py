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
        means = {k: float(np.mean(v)) for k, v in _read(self._values).items() if v}
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
        if "shown" not in state:  # a checkpoint from before `shown` was kept holds the values alone
            state = {"values": state, "shown": {k: len(v) for k, v in state.items()}}
        self._values = defaultdict(list, {k: list(v) for k, v in state["values"].items()})
        self._shown = dict(state["shown"])


def _read(values: dict[str, list[torch.Tensor | float]]) -> dict[str, list[float]]:
    """The values as floats, the tensors among them read from the device in one transfer."""
    tensors = [x for v in values.values() for x in v if isinstance(x, torch.Tensor)]
    read = iter(torch.stack([t.double() for t in tensors]).tolist() if tensors else [])
    return {k: [next(read) if isinstance(x, torch.Tensor) else float(x) for x in v] for k, v in values.items()}
