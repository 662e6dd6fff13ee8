"""The workflow's settings (workflow/config/config.yaml, extended by a profile), validated at parse time.

Snakemake's `--config key=value` turns nested values into strings (`launcher={"gpus_per_node": 2,
"container": null}` arrives as "2" and "null"); validation turns them back, and rejects unknown keys and
wrong types with one message.
"""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from pydantic import ValidationError

from sacglam_core.settings import settings


@settings
class LauncherConfig:
    """Where and how runs execute. `executor: local` runs them as local processes (no SLURM, no GPU)."""

    executor: Literal["slurm", "local"] = "slurm"
    container: str | None = None  # an Apptainer image; None runs the trainer with this Python
    binds: tuple[str, ...] = ()  # extra `apptainer --bind` paths (the repository is always bound)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None  # e.g. v100-32g
    gpus_per_node: int = 4
    cpus_per_gpu: int = 8
    mem_gb: int = 128
    time_min: int = 1200
    signal_delay_s: int = 120  # USR2 this long before the time limit: time to checkpoint
    max_requeues: int = 20
    threads_per_task: int | None = None  # OMP/torch threads of each rank
    environment: dict[str, str] | None = None  # extra environment variables of the trainer


@settings
class BudgetConfig:
    calibration: str = "workflow/config/calibration.yaml"
    gpu_name: str = "Tesla V100-SXM2-32GB"  # the calibration key of the cluster's GPUs
    allocation_gpu_hours: float | None = None  # a real launch refuses plans that need more


@settings
class WorkflowConfig:
    experiments: list[str]
    experiment_file: str = "workflow/config/experiments.yaml"
    results: str = "results"
    models: str = "resources/models"
    hf_cache: str = "resources/hf-cache"
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)


def parse_workflow_config(raw: dict) -> WorkflowConfig:
    try:
        return WorkflowConfig(**_nulls(raw))
    except ValidationError as error:
        lines = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()]
        raise ValueError("invalid workflow configuration: " + "; ".join(lines)) from None


def _nulls(value):
    """YAML's null spelt out, as Snakemake's --config leaves it in nested values, becomes None."""
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return None if value in ("null", "None", "~") else value
