"""What a run writes about itself, read without torch: finished, how far its checkpoints got, its progress.

<run>/done.json                    the trainer's summary, written once at the end: the run is finished
<run>/checkpoints/ckpt-<n>.json    checkpoint manifests: `number` is the environment step, `world` the ranks
<run>/progress.json                the trainer's latest progress line (steps, steps/s, ETA; sacglam_core/monitor.py)
<run>/train.done                   the workflow's marker (Snakemake's output), written after done.json
<run>/diverged.json                the trainer's record of a run whose training went non-finite: where, and its last
                                   finite checkpoint; no launch trains it again while it is there

Each record is read strictly: one that is not a JSON mapping, or a value of the wrong type (null, negative and NaN
included), raises RunStateError naming the file, the key and the value; a key left out takes its default.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sacglam_core.cpu import cpu_name

DONE = "done.json"
PROGRESS = "progress.json"
MARKER = "train.done"
DIVERGED = "diverged.json"
# What to do about a finished run whose files are damaged: its last checkpoint is the finished state, from which
# the trainer writes done.json, metrics.csv and config.yaml again without training a step.
REBUILD = f"delete the run's {DONE} and {MARKER} and run again: its files are rebuilt from its last checkpoint"
KINDS = {int: "a non-negative integer", float: "a non-negative number", str: "a non-empty string"}
REQUIRED = object()  # `value`'s default for a key that must be there
# The files an image of the project carries (containers/sacglam.def), whose SHA-256 identify it
IMAGE_FILES = {"definition": "sacglam.def", "lock": "requirements.lock"}
IMAGE_DIR = Path("/opt/sacglam")  # containers/sacglam.def copies its definition and the lock there


class RunStateError(ValueError):
    """A state file of a run that cannot be read; the message names it (and the key)."""


@dataclass(frozen=True)
class Progress:
    steps: int  # environment steps of the newest checkpoint
    world: int  # ranks that wrote it
    manifest: Path


@dataclass(frozen=True)
class Summary:
    """done.json: what the trainer measured over the whole run."""

    env_steps: int
    wall_seconds: float
    gpus: int  # 0 on CPUs
    gpu_name: str | None
    eval_success: float | None  # the final evaluation's; None in a summary without it
    device_plan: str | None  # the device plan's summary (device_plan.py); None in a summary from before it


@dataclass(frozen=True)
class ProgressLine:
    """progress.json: the trainer's latest progress line."""

    env_steps: int
    steps_per_s: float | None
    eta_s: float | None  # None while the pace is unknown
    wall_seconds: float
    gpus: int
    time: float | None  # when it was written (seconds since the epoch)
    device_plan: str | None  # the device plan's summary; None in a line from before it


def read_record(path: Path, what: str) -> dict | None:
    """The JSON mapping in `path`, None when there is no such file."""
    try:
        found = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RunStateError(f"{path} exists but cannot be read ({error})") from None
    if not isinstance(found, dict):
        raise RunStateError(f"{path} does not hold {what}")
    return found


def value(path: Path, found: dict, key: str, kind: type, default=REQUIRED, nullable: bool = False):
    """`found[key]` (`found` read from `path`) checked to be of `kind` (one of KINDS), `default` when left out."""
    if key not in found:
        if default is REQUIRED:
            raise RunStateError(f"{path}: {key}: missing")
        return default
    given = found[key]
    if given is None and nullable:
        return None
    try:
        number = not isinstance(given, bool) and math.isfinite(given) and given >= 0
    except (TypeError, OverflowError):  # not a number, or an integer beyond floats
        number = False
    if not {int: number and isinstance(given, int), float: number, str: isinstance(given, str) and given}[kind]:
        raise RunStateError(f"{path}: {key}: {json.dumps(given)} is not {KINDS[kind]}")
    return float(given) if kind is float else given


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of a file's bytes; None when there is no such file."""
    if not Path(path).is_file():
        return None
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def image_identity(image_dir: Path = IMAGE_DIR) -> dict | None:
    """The Apptainer image this process runs in and the SHA-256 of the definition and lock it was built from (which
    the project's image alone carries); None outside an image."""
    container = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if not container:
        return None
    return {"path": container} | {f"{k}_sha256": file_sha256(image_dir / name) for k, name in IMAGE_FILES.items()}


def hardware(gpus: int, gpu_name: str | None, cpu_kernels: str) -> dict:
    """done.json's hardware record: the GPUs a run computed on (the budget's calibration counts GPU-hours by them),
    the CPU and its kernels (other kernels round float reductions differently, and through them the sampled
    actions: cpu.py) and the image it ran in."""
    image = image_identity()
    return {
        "gpus": gpus,
        "gpu_name": gpu_name,
        "cpu_name": cpu_name(),
        "cpu_kernels": cpu_kernels,
        "container": image and image["path"],  # None outside an image
        "image": image,
    }


def done_record(env_steps: int, wall_seconds: float, train_seconds: float, eval_success: float, **parts) -> dict:
    """done.json's summary of a finished run: its length, times and final success first, then `parts` (the ranks,
    hardware, settings resolved at run time, device plan and fingerprint, as the trainer gives them)."""
    return {
        "env_steps": env_steps,
        "wall_seconds": wall_seconds,
        "train_seconds": train_seconds,
        "eval_success": eval_success,
        **parts,
    }


def plan_summary(path: Path, found: dict) -> str | None:
    """done.json's device plan, as its summary line (None in a summary from before the plan was recorded)."""
    plan = found.get("device_plan")
    if plan is None:
        return None
    if not isinstance(plan, dict):
        raise RunStateError(f"{path}: device_plan: {json.dumps(plan)} is not a device plan")
    return value(path, {f"device_plan.{k}": v for k, v in plan.items()}, "device_plan.summary", str)


def finished(run_dir: Path) -> dict | None:
    """The run's done.json, or None while it is not finished."""
    try:
        return read_record(Path(run_dir) / DONE, "a run summary")
    except RunStateError as error:
        raise RunStateError(f"{error}; {REBUILD}") from None


def summary(run_dir: Path) -> Summary | None:
    """The run's done.json with its values checked, or None while it is not finished."""
    found = finished(run_dir)
    if found is None:
        return None
    get = partial(value, Path(run_dir) / DONE, found)
    try:
        return Summary(
            env_steps=get("env_steps", int, 0),
            wall_seconds=get("wall_seconds", float, 0.0),
            gpus=get("gpus", int, 0),
            gpu_name=get("gpu_name", str, None, nullable=True),
            eval_success=get("eval_success", float, None),
            device_plan=plan_summary(Path(run_dir) / DONE, found),
        )
    except RunStateError as error:
        raise RunStateError(f"{error}; {REBUILD}") from None


def progress_line(run_dir: Path) -> ProgressLine | None:
    """The trainer's latest progress line, or None before its first."""
    path = Path(run_dir) / PROGRESS
    found = read_record(path, "a progress line")
    if found is None:
        return None
    get = partial(value, path, found)
    return ProgressLine(
        env_steps=get("env_steps", int, 0),
        steps_per_s=get("steps_per_s", float, None),
        eta_s=get("eta_s", float, None, nullable=True),
        wall_seconds=get("wall_seconds", float, 0.0),
        gpus=get("gpus", int, 0),
        time=get("time", float, None),
        device_plan=get("device_plan", str, None),
    )


def progress(run_dir: Path, skipped: list[str] | None = None) -> Progress | None:
    """The newest readable checkpoint manifest's step and ranks, or None without one. A damaged manifest is
    skipped, as the trainer skips it (it falls back to the previous one); what is wrong with it goes to `skipped`."""
    for manifest in sorted((Path(run_dir) / "checkpoints").glob("ckpt-*.json"), reverse=True):
        try:
            found = read_record(manifest, "a checkpoint manifest")
            if found is not None:  # else pruned meanwhile
                return Progress(value(manifest, found, "number", int), value(manifest, found, "world", int), manifest)
        except RunStateError as error:
            if skipped is not None:
                skipped.append(str(error))
    return None


def diverged(run_dir: Path) -> dict | None:
    """diverged.json (`message`, `env_steps`, `checkpoint`: the last finite one's step or null), or None."""
    path = Path(run_dir) / DIVERGED
    found = read_record(path, "a divergence record")
    if found is not None:
        value(path, found, "message", str)
        value(path, found, "env_steps", int)
        value(path, found, "checkpoint", int, None, nullable=True)
    return found
