"""The workflow's settings, validated at parse time; every error names the file and the key.

They come in layers, each overriding the one before: `workflow/config/config.yaml`, the files given to
Snakemake with `--configfile` (a profile's `configfile:`), the cluster file that a layer names in
`cluster_file` (a profile's `cluster.yaml`, relative to the file that names it), and last `--config
key=value`. Each file is read strictly (`yamlfile`): a duplicate key, an unquoted `20:00:00`, an example's
`<placeholder>` or an empty file is an error. Snakemake's `--config` turns nested values into strings
(`launcher={"container": null}` arrives as "null"); validation turns them back.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator

from sacglam_core.config import MonitorConfig
from sacglam_core.pipeline import yamlfile
from sacglam_core.settings import settings

DEFAULTS = Path("workflow/config/config.yaml")
SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")

GRES_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")
SBATCH_FLAG = re.compile(r"^[a-z][a-z0-9-]*$")
Positive = Annotated[int, Field(gt=0)]

# sbatch options the launcher sets itself, and the key that sets each (`sbatch_options` may not).
LAUNCHER_KEYS = {
    "partition": "launcher.partition", "account": "launcher.account", "qos": "launcher.qos",
    "constraint": "launcher.constraint", "gres": "launcher.gpus_per_node and launcher.gres_type",
    "gpus": "launcher.gpus_per_node", "gpus-per-node": "launcher.gpus_per_node", "nodes": "launcher.nodes",
    "ntasks": "launcher.gpus_per_node", "ntasks-per-node": "launcher.gpus_per_node",
    "cpus-per-task": "launcher.cpus_per_gpu", "cpus-per-gpu": "launcher.cpus_per_gpu", "mem": "launcher.mem_gb",
    "time": "launcher.time_min", "signal": "launcher.signal_delay_s", "requeue": "launcher.max_requeues",
}  # fmt: skip
OWNED_SBATCH_OPTIONS = LAUNCHER_KEYS | {
    name: "nothing (the launcher names the job and its logs)" for name in ("job-name", "output", "error", "open-mode")
}


class WorkflowConfigError(ValueError):
    """Workflow settings that cannot be used; the message names the file and the key."""


def slurm_minutes(value: str) -> int:
    """Minutes of a SLURM time limit: "MM", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS"."""
    match = SLURM_TIME.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a SLURM time limit (minutes, HH:MM:SS or D-HH:MM:SS)")
    days, first, second, third = match.groups()
    if days is None:  # MM, MM:SS or HH:MM:SS
        hours, minutes, seconds = (first, second, third) if third is not None else (0, first, second)
    else:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = first, second, third
    total = int(days or 0) * 1440 + int(hours or 0) * 60 + int(minutes or 0) + (int(seconds or 0) + 59) // 60
    return total


@settings
class LauncherConfig:
    """Where and how runs execute. `executor: local` runs them as local processes (no SLURM, no GPU)."""

    executor: Literal["slurm", "local"] = "slurm"
    container: str | None = None  # an Apptainer image; None runs the trainer with this Python
    binds: tuple[str, ...] = ()  # extra `apptainer --bind` paths (results, models, hf_cache are bound anyway)
    partition: str | None = None  # required with SLURM: never the cluster's default by accident
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None  # e.g. v100-32g
    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = 4  # ranks per run; 0 only for executor local
    gres_type: str | None = None  # the GPUs' GRES type (`sinfo -o %G`): --gres=gpu:<type>:<gpus_per_node>
    nodes: int = 1  # nodes per run: a run's ranks are one node's GPUs
    sbatch_options: dict[str, str | int | float | bool] = field(default_factory=dict)  # other sbatch options
    setup: tuple[str, ...] = ()  # shell lines the job runs before the trainer (`module load apptainer`)
    cpus_per_gpu: Positive = 8
    mem_gb: Positive = 128
    time_min: Annotated[int, Field(gt=0, le=60 * 24 * 31)] = 1200  # minutes, or a quoted "HH:MM:SS"
    signal_delay_s: Annotated[int, Field(ge=0)] = 120  # USR2 this long before the time limit: time to checkpoint
    max_requeues: Annotated[int, Field(ge=0)] = 20
    retries: Annotated[int, Field(ge=0, le=10)] = 2  # Snakemake retries of a failed train job (runs resume)
    poll_s: Annotated[float, Field(gt=0)] = 60.0  # seconds between the driver's queue polls (all jobs at once)
    threads_per_task: Positive | None = None  # OMP/torch threads of each rank
    environment: dict[str, str] | None = None  # extra environment variables of the trainer

    @field_validator("time_min", mode="before")
    @classmethod
    def _slurm_time(cls, value):
        return slurm_minutes(value) if isinstance(value, str) and not value.strip().isdigit() else value

    @field_validator("gres_type")
    @classmethod
    def _gres_type(cls, value):
        if value is not None and not GRES_TYPE.match(value):
            raise ValueError("a GRES type is one word such as a100 (the type in `sinfo -o %G`: gpu:a100:4)")
        return value

    @field_validator("nodes")
    @classmethod
    def _one_node(cls, value):
        if value != 1:
            raise ValueError("a run's ranks share one node (multi-node data parallelism is not supported): nodes: 1")
        return value

    @field_validator("sbatch_options", mode="before")
    @classmethod
    def _sbatch_options(cls, value):
        if value is None:
            return {}
        if not isinstance(value, dict):
            return value  # pydantic's own message: a mapping is expected
        options = {}
        for key, option in value.items():
            flag = str(key).strip().lstrip("-").replace("_", "-")
            if flag in OWNED_SBATCH_OPTIONS:
                raise ValueError(f"{key}: set {OWNED_SBATCH_OPTIONS[flag]} instead (the launcher sets --{flag})")
            if not SBATCH_FLAG.match(flag):
                raise ValueError(f"{key!r} is not an sbatch option name (reservation, exclude, mail-user...)")
            if option is False:
                raise ValueError(f"{key}: false: leave the option out instead (true gives --{flag})")
            if option is not None and not isinstance(option, (str, int, float)):
                raise ValueError(
                    f"{key}: {option!r} is not an sbatch option's value: one string, number or true "
                    f'(several nodes are one string, e.g. "node[01-02],node05")'
                )
            if option is not None:  # null leaves the option out, as everywhere in the cluster file
                options[flag.replace("-", "_")] = option
        return options

    @field_validator("setup", "binds", mode="before")
    @classmethod
    def _lines(cls, value):
        """null is none; one string is its lines (`setup: module load apptainer`)."""
        if value is None:
            return ()
        return tuple(line for line in value.splitlines() if line.strip()) if isinstance(value, str) else value

    @property
    def ranks(self) -> int:
        """Trainer processes of one run: one per GPU, or one on a CPU."""
        return max(self.gpus_per_node, 1)


@settings
class BudgetConfig:
    calibration: str = "workflow/config/calibration.yaml"
    gpu: str = "V100"  # the cluster's GPU type, one of the calibration table's gpus (V100, A100, H100, H200)
    allocation_gpu_hours: Annotated[float, Field(gt=0)] | None = None  # spent + planned may not exceed it


@settings
class WorkflowConfig:
    experiments: list[str]
    experiment_file: str = "workflow/config/experiments.yaml"
    study_file: str | None = "workflow/config/studies.yaml"  # more experiments, with experiment_file's defaults
    results: str = "results"
    models: str = "resources/models"
    hf_cache: str = "resources/hf-cache"
    cluster_file: str | None = None  # the cluster's settings (profiles/slurm/cluster.yaml), layered over these
    model_revisions: dict[str, str] = field(default_factory=dict)  # hub id -> pinned commit of staged models
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)  # every run's progress lines, TensorBoard, W&B
    # Where each setting was set (a file, or --config for the command line), which messages name; filled by the
    # loader, not a setting.
    origins: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def definition_files(self) -> list[str]:
        return [self.experiment_file, *([self.study_file] if self.study_file else [])]

    def origin(self, key: str) -> str:
        """Where `key` (dotted: `budget.gpu`) was set, else where to set it (the cluster file, else the workflow's
        configuration)."""
        return self.origins.get(key) or settings_file(self)


Layer = tuple[str, dict]  # (where it comes from, its values)


def load_workflow_config(configfiles: list[str | Path], overrides: dict) -> WorkflowConfig:
    """The settings from `workflow/config/config.yaml`, `configfiles`, the cluster file and `overrides`."""
    try:
        layers: list[Layer] = [(str(DEFAULTS), yamlfile.load(DEFAULTS, "workflow configuration"))]
        for path in configfiles:
            if Path(path).resolve() != DEFAULTS.resolve():
                layers.append((_relative(path), yamlfile.load(path, "workflow configuration")))
        command_line: Layer = ("--config", _nulls(dict(overrides)))
        cluster_file = _cluster_file([*layers, command_line])
        if cluster_file:
            layers.append((cluster_file, yamlfile.load(cluster_file, "cluster settings file")))
            command_line = (command_line[0], {**command_line[1], "cluster_file": cluster_file})
    except yamlfile.YamlFileError as error:
        raise WorkflowConfigError(str(error)) from None
    return parse_layers([*layers, command_line])


def _cluster_file(layers: list[Layer]) -> str | None:
    """The cluster file's path: relative to the file that names it (a copied profile reads its own), or to the
    working directory when `--config` names it. A missing one names the example to copy."""
    name = _merged(layers).get("cluster_file")
    if not name:
        return None
    where = _origin(layers, ["cluster_file"])
    path = Path(name) if Path(name).is_absolute() or where == "--config" else Path(where).parent / name
    if not path.exists():
        example = path.with_name(f"{path.stem}.example{path.suffix}")
        advice = f"copy {example} to it and set its <...> values" if example.exists() else "create it"
        raise yamlfile.YamlFileError(f"{where}: cluster_file: {path} does not exist: {advice} (docs/cluster.md)")
    return _relative(path)


def parse_workflow_config(raw: dict, where: str = "workflow configuration") -> WorkflowConfig:
    """Settings from one mapping (tests, tools); errors name `where`."""
    return parse_layers([(where, _nulls(raw))])


def parse_layers(layers: list[Layer]) -> WorkflowConfig:
    merged = _merged(layers)
    try:
        config = WorkflowConfig(**merged)
    except ValidationError as error:
        problems = []
        for e in error.errors():
            keys = [str(k) for k in e["loc"]]
            message = e["msg"].removeprefix("Value error, ")
            got = "" if isinstance(e.get("input"), dict) else f" (got {e.get('input')!r})"  # the message names it
            problems.append(f"{_origin(layers, keys)}: {'.'.join(keys)}: {message}{got}")
        raise WorkflowConfigError("; ".join(problems)) from None
    except TypeError as error:
        raise WorkflowConfigError(f"{' / '.join(w for w, _ in layers)}: {error}") from None
    _check_coherence(config, layers)
    leaves = _leaves(merged)
    return dataclasses.replace(config, origins={key: _origin(layers, key.split(".")) for key in leaves})


def _leaves(values: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a mapping's values that are not mappings."""
    out = []
    for key, value in values.items():
        out += _leaves(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"]
    return out


def _check_coherence(config: WorkflowConfig, layers: list[Layer]) -> None:
    launcher = config.launcher
    if launcher.executor == "slurm" and launcher.gpus_per_node < 1:
        raise WorkflowConfigError(
            f"{_origin(layers, ['launcher', 'gpus_per_node'])}: launcher.gpus_per_node: {launcher.gpus_per_node}: a "
            "SLURM run needs at least 1 GPU (one rank per GPU); 0 is for executor: local"
        )
    if launcher.signal_delay_s >= launcher.time_min * 60:
        raise WorkflowConfigError(
            f"{_origin(layers, ['launcher', 'signal_delay_s'])}: launcher.signal_delay_s={launcher.signal_delay_s} "
            f"leaves no training time within launcher.time_min={launcher.time_min} minutes"
        )


# Resources that Snakemake's own SLURM executor reads, and the launcher's key that does the same here.
SNAKEMAKE_RESOURCES = {
    "slurm_partition": "launcher.partition", "slurm_account": "launcher.account", "slurm_qos": "launcher.qos",
    "qos": "launcher.qos", "constraint": "launcher.constraint", "runtime": "launcher.time_min",
    "cpus_per_task": "launcher.cpus_per_gpu", "mem_mb_per_cpu": "launcher.mem_gb", "gres": "launcher.gres_type",
    "gpu": "launcher.gpus_per_node", "gpus": "launcher.gpus_per_node", "nodes": "launcher.nodes",
    "tasks": "launcher.gpus_per_node", "tasks_per_node": "launcher.gpus_per_node",
    "slurm_extra": "launcher.sbatch_options",
}  # fmt: skip


def refuse_snakemake_resources(config: WorkflowConfig, given: dict[str, list[str]]) -> None:
    """Refuse SLURM options given as Snakemake resources (`given`: option -> resource names), which the workflow's
    launcher would otherwise ignore without a word: one line names the cluster file's key to use instead."""
    for option, names in given.items():
        for name in names:
            key = SNAKEMAKE_RESOURCES.get(name) or ("launcher.sbatch_options" if name.startswith("slurm_") else None)
            if key:
                raise WorkflowConfigError(
                    f"{option} {name}: the training jobs' SLURM options come from the cluster file, not from "
                    f"Snakemake's resources: set {key} in {settings_file(config)}"
                )


def settings_file(config: WorkflowConfig) -> str:
    """Where a user sets the launcher's options: the cluster file, else the workflow's configuration."""
    return config.cluster_file or str(DEFAULTS)


def _origin(layers: list[Layer], keys: list[str]) -> str:
    """The last layer that sets `keys` (a dotted path); for a key no layer sets (or sets to null), the last file:
    where to set it."""
    for where, values in reversed(layers):
        node = values
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            if node is not None:
                return where
    files = [where for where, _ in layers if where != "--config"]
    return files[-1] if files else layers[-1][0]


def _merged(layers: list[Layer]) -> dict:
    out: dict = {}
    for _, values in layers:
        out = _merge(out, values)
    return out


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _relative(path: str | Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _nulls(value):
    """YAML's null spelt out, as Snakemake's --config leaves it in nested values, becomes None."""
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return None if value in ("null", "None", "~") else value
