"""Where a run stands: its counters, saved in its checkpoints and restored from them as one."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields


@dataclass
class RunCounters:
    env_steps: int = 0
    episodes: int = 0  # training episodes finished, over every rank
    eval_rounds: int = 0  # evaluation rounds played, each with its own random numbers
    elapsed: float = 0.0  # wall seconds of the loop, over every attempt
    train_seconds: float = 0.0  # of them, acting and updating (without evaluations and checkpoints)
    last_row: tuple[float, int, int] = (0.0, 0, 0)  # wall seconds, env steps and updates at the last metrics row
    last_success: float = math.nan  # the last evaluation's success
    resumes: list[dict] = field(default_factory=list)  # each resume's step and weights' checksums, saved and loaded
    network: list = field(default_factory=list)  # connections loading the model started, in every attempt

    def state_dict(self) -> dict:
        return asdict(self) | {"last_row": list(self.last_row)}

    @classmethod
    def from_state_dict(cls, state: dict) -> RunCounters:
        """The counters of a checkpoint's `counters` (which also holds the metrics rows and the weights' checksum)."""
        counters = cls(**{f.name: state[f.name] for f in fields(cls)})
        counters.last_row = tuple(counters.last_row)
        return counters
