"""Measured training speeds per GPU type, from which the GPU-hour budget prices runs on that type.

One file per type, `gpu_rates/<type>.yaml` beside the calibration table (workflow/config/gpu_rates/H100.yaml), written
by `python -m sacglam_core.benchmarks.gpu_check` on a GPU of that type, or by hand for a measurement made otherwise.
It holds measurements of one process at gpu_check's per-rank settings, one per setting (compute dtype, 4-bit weights or
not, SAC's critic, data-parallel ranks the process held on its GPU, 4-bit weights dequantized once at load or not),
each with its environment steps/s per algorithm
and where they come from. gpu_check replaces the
measurements of the settings it measured and keeps the others.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from sacglam_core.atomic import write_text
from sacglam_core.pipeline import yamlfile
from sacglam_core.settings import settings

FOLDER = "gpu_rates"  # beside the calibration table
Algorithm = Literal["sac", "sac+her", "ppo", "ppo+her"]  # the budget's algorithm keys
StepsPerSecond = Annotated[float, Field(gt=0)]
HEADER = (
    "# One process's training speed on {gpu}, measured by python -m sacglam_core.benchmarks.gpu_check (or as `notes`\n"
    "# says). In workflow/config/gpu_rates/, the GPU-hour budget prices runs on {gpu} from it (docs/cluster.md).\n"
)


class GpuRatesError(ValueError):
    """A rates file that cannot be used; the message names the file and the key."""


@settings
class Speed:
    """The process's environment steps per second (its ranks' environments together) and its memory."""

    steady: StepsPerSecond | None = None
    """Once the loop is steady: SAC from the middle of its updating steps, PPO over the rollout+update cycles after
    its first."""
    whole_run: StepsPerSecond | None = None
    """Over the whole run, with the first steps, which only act (faster), and the first calls of each kind, which
    capture and compile (slower)."""
    peak_memory_gib: Annotated[float, Field(gt=0)] | None = None
    """The process's peak of GPU memory in GiB (torch.cuda.max_memory_reserved: what its allocator held, which the
    GPU's memory must fit); None where not measured."""

    @model_validator(mode="after")
    def _measured(self):
        if self.steady is None and self.whole_run is None:
            raise ValueError("give steady, whole_run or both")
        return self

    @property
    def best(self) -> tuple[float, str]:
        """The steady rate if measured, else the whole run's; and which it is."""
        return (self.steady, "steady") if self.steady is not None else (self.whole_run, "whole run")


@settings
class Measurement:
    """One rank of the paper's run at gpu_check's per-rank settings, in one setting, and where its figures come
    from."""

    dtype: Literal["bfloat16", "float16", "float32"]
    load_in_4bit: bool
    critic: Literal["obs_action", "obs", "decoded_action"]  # SAC's sac.critic.input
    env_steps_per_s: Annotated[dict[Algorithm, Speed], Field(min_length=1)]  # of the process, all its ranks
    device_name: str  # torch.cuda.get_device_name
    date: datetime.date
    command: str
    ranks_per_gpu: Annotated[int, Field(ge=1)] = 1  # data-parallel ranks the process held on its GPU
    dequantize_4bit: bool = False  # model.dequantize_4bit: the 4-bit weights dequantized once at load
    commit: str | None = None
    torch: str | None = None
    transformers: str | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _dequantized_from_4bit(self):
        if self.dequantize_4bit and not self.load_in_4bit:
            raise ValueError("dequantize_4bit needs load_in_4bit: it dequantizes the 4-bit weights")
        return self

    @property
    def setting(self) -> tuple[str, bool, str, int, bool]:
        return self.dtype, self.load_in_4bit, self.critic, self.ranks_per_gpu, self.dequantize_4bit


@settings
class GpuRates:
    gpu: str  # a type of the calibration table's gpus, and the file's name
    measurements: Annotated[list[Measurement], Field(min_length=1)]

    def find(
        self, dtype: str, load_in_4bit: bool, critic: str, ranks_per_gpu: int = 1, dequantize_4bit: bool = False
    ) -> Measurement | None:
        """The measurement in `dtype` with these weights and ranks per GPU, of this critic where there is one, then
        of 4-bit weights dequantized once or not as asked where there is one (the same products, without the
        per-pass dequantization: 4-bit's rate bounds the dequantized one's GPU-hours from above)."""
        matching = [
            m
            for m in self.measurements
            if (m.dtype, m.load_in_4bit, m.ranks_per_gpu) == (dtype, load_in_4bit, ranks_per_gpu)
            and (dequantize_4bit or not m.dequantize_4bit)
        ]
        return min(matching, key=lambda m: (m.critic != critic, m.dequantize_4bit != dequantize_4bit), default=None)


def load(path: str | Path, gpus: list[str]) -> GpuRates:
    """The file at `path`, checked against the calibration table's GPU types `gpus`."""
    try:
        raw = yamlfile.load(path, "GPU rates file")
        rates = GpuRates(**raw)
    except yamlfile.YamlFileError as error:
        raise GpuRatesError(str(error)) from None
    except ValidationError as error:
        problems = []
        for e in error.errors():
            got = "" if isinstance(e.get("input"), dict | list) else f" (got {e.get('input')!r})"
            key = ".".join(str(k) for k in e["loc"] if k != "[key]")
            problems.append(f"{key}: {e['msg'].removeprefix('Value error, ')}{got}")
        raise GpuRatesError(f"{path}: {'; '.join(problems)}") from None
    except TypeError as error:  # a key that is not a string
        raise GpuRatesError(f"{path}: {error}") from None
    if rates.gpu not in gpus:
        raise GpuRatesError(
            f"{path}: gpu: {rates.gpu} is not a GPU of the calibration table ({', '.join(gpus)}): add it there "
            f"(its dense peaks and the words of its device name) or remove this file"
        )
    settings = [m.setting for m in rates.measurements]
    twice = next((setting for setting in settings if settings.count(setting) > 1), None)
    if twice:
        dtype, load_in_4bit, critic, ranks_per_gpu, dequantize_4bit = twice
        raise GpuRatesError(
            f"{path}: measurements: two of dtype {dtype}, load_in_4bit {str(load_in_4bit).lower()}, critic {critic}, "
            f"ranks_per_gpu {ranks_per_gpu}, dequantize_4bit {str(dequantize_4bit).lower()}: keep one"
        )
    return rates


def load_folder(folder: str | Path, gpus: list[str]) -> dict[str, GpuRates]:
    """Every file of `folder` (none if it does not exist), by GPU type."""
    out = {}
    for path in sorted(Path(folder).glob("*.yaml")) if Path(folder).is_dir() else []:
        rates = load(path, gpus)
        if path.name != f"{rates.gpu}.yaml":
            raise GpuRatesError(f"{path}: gpu: {rates.gpu} is measured in {rates.gpu}.yaml, one file per GPU type")
        out[rates.gpu] = rates
    return out


def record(path: str | Path, gpu: str, measurements: list[Measurement]) -> GpuRates:
    """Write `measurements` of `gpu` into `path` (atomically), over those of the same settings already there."""
    new = {m.setting for m in measurements}
    kept = load(path, [gpu]).measurements if Path(path).exists() else []
    rates = GpuRates(gpu, [m for m in kept if m.setting not in new] + measurements)
    raw = dataclasses.asdict(rates)
    for measurement in raw["measurements"]:  # a figure not measured is left out, not written as null
        if not measurement["dequantize_4bit"]:  # nor the default setting
            del measurement["dequantize_4bit"]
        for speed in measurement["env_steps_per_s"].values():
            for key in [k for k, v in speed.items() if v is None]:
                del speed[key]
    body = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, width=96)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, HEADER.format(gpu=gpu) + body)
    return rates
