"""GPU-hour budget of the runs a workflow invocation would launch, from a calibration table.

The table gives training throughput in environment steps per GPU-hour. It is seeded from the paper
(Appendix C: 400,000 steps take 80 GPU-hours per seed on V100 32GB) in `workflow/config/calibration.yaml`
and updated from finished runs: every `done.json` records steps, wall time and GPUs, and the measured
median per key (algorithm, model, environment, GPU) replaces the seeded figure. Runs without GPUs (the
local profile) are calibrated in steps per hour of one run, under the GPU name "cpu".
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from sacglam_core.config import RunConfig
from sacglam_core.pipeline.experiments import Run


class BudgetExceededError(RuntimeError):
    """The plan needs more GPU-hours than the configured allocation."""


def calibration_key(config: RunConfig, gpu: str) -> str:
    algorithm = config.algorithm + ("+her" if config.her.enabled else "")
    env = "simplified" if config.env.simplified else "full"
    return f"{algorithm}|{Path(config.model.name_or_path).name}|{env}|{gpu}"


@dataclass
class Calibration:
    default: float  # steps per GPU-hour when nothing better is known
    seeded: dict[str, float]
    measured: dict[str, float]

    def rate(self, key: str) -> tuple[float, str]:
        if key in self.measured:
            return self.measured[key], "measured"
        if key in self.seeded:
            return self.seeded[key], "table"
        if key.endswith("|cpu"):
            return float("nan"), "not measured yet"
        return self.default, "paper"


def load_calibration(table: str | Path, results: str | Path) -> Calibration:
    seeded = yaml.safe_load(Path(table).read_text()) or {}
    samples: dict[str, list[float]] = defaultdict(list)
    for done in Path(results).glob("*/*/seed*/done.json"):
        try:
            summary = json.loads(done.read_text())
            config = RunConfig(**yaml.safe_load((done.parent / "config.yaml").read_text()))
        except (OSError, ValueError, TypeError):
            continue  # an unreadable or foreign run does not calibrate anything
        gpus = summary.get("gpus", 0)
        if summary.get("wall_seconds", 0) > 0:
            rate = summary["env_steps"] / (summary["wall_seconds"] / 3600 * max(gpus, 1))
            samples[calibration_key(config, summary.get("gpu_name") if gpus else "cpu")].append(rate)
    measured = {k: statistics.median(v) for k, v in samples.items()}
    return Calibration(float(seeded.get("default_steps_per_gpu_hour", 5000)), dict(seeded.get("keys") or {}), measured)


@dataclass
class Line:
    experiment: str
    variant: str
    runs: int
    gpus: int
    hours: float  # wall hours of one run
    source: str

    @property
    def gpu_hours(self) -> float:
        return self.runs * self.gpus * self.hours if self.gpus else 0.0


def plan(runs: list[Run], gpus_per_run: int, gpu_name: str, calibration: Calibration) -> list[Line]:
    """Budget lines for the runs that are not finished yet, one per (experiment, variant)."""
    gpu_name = gpu_name if gpus_per_run else "cpu"
    lines: dict[tuple[str, str], Line] = {}
    for run in runs:
        if (run.directory / "done.json").exists():
            continue
        config = run.config
        rate, source = calibration.rate(calibration_key(config, gpu_name))
        hours = config.total_steps / rate / max(gpus_per_run, 1)
        line = lines.setdefault(
            (run.experiment, run.variant), Line(run.experiment, run.variant, 0, gpus_per_run, hours, source)
        )
        line.runs += 1
    return list(lines.values())


def total(lines: list[Line]) -> float:
    return sum(line.gpu_hours for line in lines)


def report(lines: list[Line], finished: int, limit: float | None) -> str:
    out = [f"GPU-hour budget of the runs to launch ({finished} finished runs are skipped):"]
    out.append(f"  {'experiment':<22}{'variant':<40}{'runs':>5} x {'GPUs':>4} x {'hours':>7} = {'GPU-h':>9}  estimate")
    for line in sorted(lines, key=lambda x: (x.experiment, x.variant)):
        out.append(
            f"  {line.experiment:<22}{line.variant[:39]:<40}{line.runs:>5} x {line.gpus:>4} x {_hours(line.hours)} = "
            f"{line.gpu_hours:>9.1f}  {line.source}"
        )
    allocation = "no allocation limit set" if limit is None else f"allocation limit {limit:,.0f} GPU-h"
    out.append(f"  total: {sum(x.runs for x in lines)} runs, {total(lines):,.1f} GPU-hours ({allocation})")
    return "\n".join(out)


def _hours(hours: float) -> str:
    return f"{hours:>7.1f}" if math.isfinite(hours) else f"{'?':>7}"


def check_allocation(lines: list[Line], limit: float | None) -> None:
    if limit is not None and total(lines) > limit:
        raise BudgetExceededError(
            f"the plan needs {total(lines):,.1f} GPU-hours but the allocation limit is {limit:,.1f} "
            f"(budget.allocation_gpu_hours): launch fewer experiments or seeds, or raise the limit"
        )
