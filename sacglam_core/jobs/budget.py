"""GPU-hour budget of the training jobs Snakemake will run, and the allocation guard.

The runs budgeted are the `train` jobs of Snakemake's plan (its DAG's needrun jobs, see workflow/rules/
common.smk), never a guess from files: a run Snakemake does not plan costs nothing. A planned run costs
its remaining steps: all of them when new, those after its newest checkpoint when it resumes, none when
its done.json exists (only the workflow's marker is missing).

Throughput, in environment steps per GPU-hour, comes from the first of: finished runs (the median of their done.json per
key: algorithm, model, environment, GPU type, ranks per GPU); `workflow/config/calibration.yaml`'s keys; what gpu_check
measured (`gpu_rates/<type>.yaml` beside the table: one process's steps/s on its GPU), on the GPU type, else on another
that computes in the same dtype, times the ratio of their dense peaks; the paper's figure (Appendix C), times the ratio
of the GPU's dense peak to the paper's V100's on another type (the paper's implementation scaled by peaks, not this
code: where both exist, this code measured faster). A run prices with the GPUs it uses: one per process, each holding
`ranks / GPUs` of its data-parallel ranks (`RunConfig.ranks`); without a measurement of that many ranks per GPU, one
rank per GPU's rate (a process of several ranks is at least as fast). An algorithm that gpu_check or the paper did not
measure is scaled from one they did by the table's relative costs. Runs without GPUs (the local profile) are measured
in steps per hour of one run.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sacglam_core import runfiles
from sacglam_core.config import ConfigError, RunConfig, load_config
from sacglam_core.jobs import gpu_rates, runstate
from sacglam_core.pipeline import yamlfile
from sacglam_core.pipeline.experiments import Run

PEAK_RATIO = "peak-ratio rule"  # the label of rates from the paper's V100 rate times a ratio of dense peaks
GPU_CHECK = "gpu_check measured"  # the label of rates from gpu_check's files


class BudgetExceededError(RuntimeError):
    """The plan, with the hours already spent, needs more GPU-hours than the allocation."""


def algorithm_key(config: RunConfig) -> str:
    return config.algorithm + ("+her" if config.her.enabled else "")


def calibration_key(config: RunConfig, gpu: str, ranks_per_gpu: int = 1) -> str:
    env = "simplified" if config.env.simplified else "full"
    key = f"{algorithm_key(config)}|{Path(config.model.name_or_path).name}|{env}|{gpu}"
    # a faster setting's finished runs must not price the paper's: the dequantized weights' keep a key of their own
    dequantized = "|4-bit dequantized once" if config.model.dequantize_4bit else ""
    return key + dequantized + (f"|{ranks_per_gpu} ranks per GPU" if ranks_per_gpu > 1 else "")


def ranks_per_gpu(config: RunConfig, gpus: int) -> int:
    """The data-parallel ranks each process of a run holds on its GPU, with `gpus` processes (one GPU each) per run:
    one, unless the run's `ranks` are more than its GPUs."""
    return max(1, (config.ranks or gpus) // gpus) if gpus else 1


@dataclass(frozen=True)
class Paper:
    """The paper's figure: `gpu_hours_per_seed` for `steps_per_seed` steps on `gpu` in `dtype` (Appendix C)."""

    gpu_hours_per_seed: float = 80.0
    steps_per_seed: int = 400_000
    gpu: str = "V100"
    dtype: str = "float16"
    model: str = "flan-t5-base"

    @property
    def steps_per_gpu_hour(self) -> float:
        return self.steps_per_seed / self.gpu_hours_per_seed


@dataclass(frozen=True)
class Gpu:
    """A GPU type of the calibration table: dense peak TFLOP/s per dtype and what resolves `dtype: auto`."""

    capability: tuple[int, int]
    names: tuple[str, ...]  # words of the device name (torch.cuda.get_device_name) that identify it
    tflops: dict[str, float]
    memory_gib: float | None = None  # what torch.cuda.get_device_properties(...).total_memory reports, in GiB

    def peak(self, config: RunConfig) -> tuple[str, float]:
        """(the dtype `config` computes in on this GPU, its dense peak TFLOP/s)."""
        dtype = config.model.compute_dtype(self.capability)
        return dtype, self.tflops.get(dtype, float("nan"))


@dataclass
class Calibration:
    paper: Paper
    relative_cost: dict[str, float]  # algorithm key -> GPU time per step relative to the paper's figure
    gpus: dict[str, Gpu] = field(default_factory=dict)  # GPU type -> its peaks
    seeded: dict[str, float] = field(default_factory=dict)  # key -> steps per GPU-hour, from the table
    checked: dict[str, gpu_rates.GpuRates] = field(default_factory=dict)  # GPU type -> what gpu_check measured there
    rates_folder: Path | None = None  # where those files are
    measured: dict[str, list[float]] = field(default_factory=dict)  # key -> rates of finished runs

    def gpu_type(self, device_name: str | None) -> str:
        """The table's type of a device name as finished runs record it (`Tesla V100-SXM2-32GB` -> V100)."""
        for name, gpu in self.gpus.items():
            if device_name and any(word in device_name for word in gpu.names):
                return name
        return device_name or "unknown"

    def dtype_on(self, gres_type: str, config: RunConfig) -> str | None:
        """The dtype `config` computes in on GPUs of this GRES type (`a100`, `tesla_v100`), None if unknown."""
        for gpu in self.gpus.values():
            if any(word.lower() in gres_type.lower() for word in gpu.names):
                return gpu.peak(config)[0]
        return None

    def rate(self, config: RunConfig, gpu: str, per_gpu: int = 1) -> tuple[float, str]:
        """Steps per GPU-hour (per hour on a CPU) of `config` on `gpu` (a type, or cpu) with `per_gpu` data-parallel
        ranks on each GPU, and where it comes from (the first source the module's docstring lists that has it)."""
        key = calibration_key(config, gpu, per_gpu)
        if key in self.measured:
            return statistics.median(self.measured[key]), f"measured ({len(self.measured[key])} runs)"
        if key in self.seeded:
            return self.seeded[key], "calibration table"
        if gpu == "cpu":
            return float("nan"), "not measured yet"
        algorithm = algorithm_key(config)
        cost = self.relative_cost.get(algorithm, 1.0)
        dtype, peak = self.gpus[gpu].peak(config)
        checked = self._checked(config, gpu, per_gpu)
        if checked:
            return checked
        rate = self.paper.steps_per_gpu_hour / cost
        if gpu != self.paper.gpu or dtype != self.paper.dtype:
            ratio = peak / self.gpus[self.paper.gpu].tflops[self.paper.dtype]
            return rate * ratio, f"{PEAK_RATIO} x{ratio:.2f} ({gpu} {dtype}), not measured"
        paper_setting = (
            config.total_steps == self.paper.steps_per_seed
            and not config.env.simplified
            and Path(config.model.name_or_path).name == self.paper.model
        )
        if not paper_setting:
            return rate, "scaled estimate"
        return rate, "paper" if cost == 1.0 else f"paper, {algorithm} x{cost:g}"

    def peak_memory(self, config: RunConfig, gpu: str, per_gpu: int) -> tuple[float, str] | None:
        """A process's measured peak of GPU memory in GiB for `config` with `per_gpu` ranks on its GPU, and where it
        was measured: gpu_check's measurement of this many ranks per GPU in the run's dtype and weights, of its
        algorithm (else the nearest), on this GPU type first, else on another (memory does not scale with peaks);
        None where none was measured (a dequantized run's never from 4-bit weights', which hold less)."""
        dtype = self.gpus[gpu].peak(config)[0]
        dequantized = config.model.dequantize_4bit
        found = []
        for measured_on, rates in self.checked.items():
            m = rates.find(dtype, config.model.load_in_4bit, config.sac.critic.input, per_gpu, dequantized)
            if m is not None and m.dequantize_4bit != dequantized:
                continue
            for algorithm, speed in m.env_steps_per_s.items() if m else ():
                if speed.peak_memory_gib is not None:
                    rank = (
                        measured_on != gpu,
                        algorithm != algorithm_key(config),
                        algorithm.split("+")[0] != (config.algorithm),
                    )
                    found.append((rank, measured_on, speed.peak_memory_gib))
        if not found:
            return None
        _, measured_on, gib = min(found)
        return gib, measured_on

    def _checked(self, config: RunConfig, gpu: str, per_gpu: int) -> tuple[float, str] | None:
        """Steps per GPU-hour from what gpu_check measured: on this GPU type first, else on another that computes the
        run in the same dtype, scaled by the ratio of their dense peaks; then the run's own algorithm, else the nearest
        measured one scaled by their relative costs (the same without or with HER first); then as many ranks per GPU,
        else one per GPU (a process of several ranks is at least as fast: an upper bound on GPU-hours)."""
        algorithm = algorithm_key(config)
        family = algorithm.split("+")[0]
        dtype, peak = self.gpus[gpu].peak(config)
        found = []
        for measured_on, rates in self.checked.items():
            on_dtype, on_peak = self.gpus[measured_on].peak(config) if measured_on in self.gpus else (None, 0.0)
            if on_dtype != dtype:  # another dtype computes otherwise (float16 is eager and loss-scaled)
                continue
            for ranks in dict.fromkeys((per_gpu, 1)):
                m = rates.find(
                    dtype, config.model.load_in_4bit, config.sac.critic.input, ranks, config.model.dequantize_4bit
                )
                for measured in m.env_steps_per_s if m else ():
                    rank = (
                        measured_on != gpu,
                        measured != algorithm,
                        measured.split("+")[0] != family,
                        ranks != per_gpu,
                    )
                    found.append((rank, measured_on, on_peak, measured, ranks, m))
        if not found:
            return None
        _, measured_on, on_peak, measured, ranks, m = min(found, key=lambda f: (f[0], f[1]))
        per_second, which = m.env_steps_per_s[measured].best
        relative = self.relative_cost.get(measured, 1.0) / self.relative_cost.get(algorithm, 1.0)
        source = f"{GPU_CHECK} {m.date}" + (", whole run" if which == "whole run" else "")
        if measured_on != gpu:
            source += f", on {measured_on} x{peak / on_peak:.2f} (dense peaks)"
        if m.dequantize_4bit != config.model.dequantize_4bit:
            source += ", from 4-bit weights"
        if measured != algorithm:
            source += f", from {measured} x{relative:.2f}"
        if ranks != per_gpu:
            source += f", one rank per GPU's for {per_gpu}"
        # a process per GPU: its steps/s are its GPU's steps per 3,600 s
        return per_second * 3600 * relative * peak / on_peak, source

    def work(self, config: RunConfig) -> float:
        """A run's length in units of the paper's step cost: its steps times its algorithm's relative cost."""
        return config.total_steps * self.relative_cost.get(algorithm_key(config), 1.0)


def load_table(table: str | Path) -> Calibration:
    """The calibration table and the gpu_check files beside it (`gpu_rates/`), without finished runs."""
    try:
        raw = yamlfile.load(table, "calibration table")
        gpus = {
            name: Gpu(
                tuple(entry["capability"]),
                tuple(entry["names"]),
                {k: float(v) for k, v in entry["tflops"].items()},
                float(entry["memory_gib"]) if entry.get("memory_gib") is not None else None,
            )
            for name, entry in (raw.get("gpus") or {}).items()
        }
        calibration = Calibration(
            Paper(**(raw.get("paper") or {})),
            {k: float(v) for k, v in (raw.get("relative_cost") or {}).items()},
            gpus,
            {k: float(v) for k, v in (raw.get("keys") or {}).items()},
        )
    except yamlfile.YamlFileError as error:
        raise ValueError(str(error)) from None
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"calibration table {table}: cannot read it ({type(error).__name__}: {error})") from None
    if calibration.paper.gpu not in gpus or calibration.paper.dtype not in gpus[calibration.paper.gpu].tflops:
        raise ValueError(f"calibration table {table}: gpus has no {calibration.paper.dtype} peak of the paper's GPU")
    calibration.rates_folder = Path(table).parent / gpu_rates.FOLDER
    calibration.checked = gpu_rates.load_folder(calibration.rates_folder, list(gpus))
    return calibration


def load_calibration(table: str | Path, results: str | Path) -> Calibration:
    """The calibration table, the gpu_check files beside it and the finished runs under `results`."""
    calibration = load_table(table)
    for record in finished_runs(results, calibration):
        if record.gpu_hours_per_step:
            calibration.measured.setdefault(record.key, []).append(1 / record.gpu_hours_per_step)
    return calibration


@dataclass(frozen=True)
class FinishedRun:
    directory: Path
    key: str
    env_steps: int
    gpus: int
    wall_hours: float

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.wall_hours

    @property
    def gpu_hours_per_step(self) -> float:
        return self.wall_hours * max(self.gpus, 1) / self.env_steps if self.env_steps and self.wall_hours else 0.0


def finished_runs(results: str | Path, calibration: Calibration) -> list[FinishedRun]:
    """Every finished run under `results` with the configuration it ran (damaged ones are skipped: `status` names
    them), keyed by the calibration table's type of the GPU it ran on."""
    out = []
    for done in sorted(Path(results).glob(f"*/*/seed*/{runfiles.DONE}")):
        try:
            summary = runfiles.summary(done.parent)
            config = load_config(done.parent / "config.yaml")
        except (runfiles.RunStateError, ConfigError):
            continue  # a foreign or broken run does not calibrate anything
        if summary is None:
            continue  # removed meanwhile
        gpu = calibration.gpu_type(summary.gpu_name) if summary.gpus else "cpu"
        key = calibration_key(config, gpu, ranks_per_gpu(config, summary.gpus))
        out.append(FinishedRun(done.parent, key, summary.env_steps, summary.gpus, summary.wall_seconds / 3600))
    return out


# -- the plan -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """One planned run: what is left of it and what that costs."""

    run: Run
    status: str  # new | resumes | in queue | finished
    remaining_steps: int
    gpus: int
    rate: float  # steps per GPU-hour (per hour of one run on a CPU)
    source: str

    @property
    def wall_hours(self) -> float:
        return self.remaining_steps / self.rate / max(self.gpus, 1) if self.remaining_steps else 0.0

    @property
    def gpu_hours(self) -> float:
        return self.wall_hours * self.gpus if self.gpus else 0.0


@dataclass(frozen=True)
class Limits:
    """What a SLURM job may use: `time_min` minutes, of which the last `signal_delay_s` go to checkpointing."""

    time_min: int
    signal_delay_s: int
    max_requeues: int

    @property
    def hours_per_attempt(self) -> float:
        return (self.time_min * 60 - self.signal_delay_s) / 3600

    def attempts(self, wall_hours: float) -> int:
        """Jobs a run needs (it resumes from its checkpoint in the next one); NaN hours count as one."""
        return max(1, math.ceil(wall_hours / self.hours_per_attempt)) if math.isfinite(wall_hours) else 1


@dataclass(frozen=True)
class Layout:
    """The plan's runs of `ranks` data-parallel ranks as `gpus_per_node` processes, a GPU each (the launcher's
    setting): what training them costs, and whether a process fits its GPU."""

    gpus_per_node: int
    ranks: int
    gpu_hours: float
    wall_hours: float  # the longest run's
    peak_gib: float | None  # the largest measured peak of a process among the runs (None: none measured)
    memory_gib: float | None  # the GPU type's

    @property
    def name(self) -> str:
        per_gpu = self.ranks // self.gpus_per_node
        return "a GPU per rank" if per_gpu == 1 else f"{per_gpu} ranks on one GPU"

    @property
    def fits(self) -> bool | None:
        """Whether a process's measured peak fits the GPU's memory (None: either is unknown)."""
        if self.peak_gib is None or self.memory_gib is None:
            return None
        return self.peak_gib <= self.memory_gib


def price_layouts(
    runs: list[Run], gpu_type: str, calibration: Calibration, queued: frozenset[Path] = frozenset()
) -> list[Layout]:
    """Both layouts of the plan's runs with their own `ranks` (several data-parallel ranks that do not change with
    the processes): a GPU per rank, and all ranks held by one process on one GPU; none where no run has several."""
    ranks = {run.config.ranks for run in runs if run.config.ranks and run.config.ranks > 1}
    if len(ranks) != 1:  # none, or runs of different ranks: no one launcher setting moves them all
        return []
    (rank_count,) = ranks
    runs = [run for run in runs if run.config.ranks == rank_count]  # without `ranks`, a run's follow its processes
    layouts = []
    for gpus in (rank_count, 1):
        estimates = [e for e in estimate(runs, gpus, gpu_type, calibration, queued) if e.remaining_steps]
        peaks = [calibration.peak_memory(e.run.config, gpu_type, ranks_per_gpu(e.run.config, gpus)) for e in estimates]
        layouts.append(
            Layout(
                gpus,
                rank_count,
                sum(e.gpu_hours for e in estimates),
                max((e.wall_hours for e in estimates), default=0.0),
                None if not peaks or None in peaks else max(gib for gib, _ in peaks),
                calibration.gpus[gpu_type].memory_gib,
            )
        )
    return layouts


def cheapest(layouts: list[Layout]) -> Layout | None:
    """The layout of fewest GPU-hours among those whose process fits its GPU (fewer wall hours on a tie)."""
    fitting = [layout for layout in layouts if layout.fits and math.isfinite(layout.gpu_hours)]
    return min(fitting, key=lambda layout: (round(layout.gpu_hours, 6), layout.wall_hours), default=None)


@dataclass
class Budget:
    estimates: list[Estimate]
    spent_finished: float  # GPU-hours of finished runs (measured)
    spent_partial: float  # GPU-hours of the checkpointed part of unfinished runs (estimated)
    limits: Limits
    calibration: Calibration
    layouts: list[Layout] = field(default_factory=list)  # the plan in each layout (runs with several ranks)
    gpus_per_node: int = 0  # the launcher's (0: no GPUs)

    @property
    def planned(self) -> float:
        return sum(e.gpu_hours for e in self.estimates if math.isfinite(e.gpu_hours))

    @property
    def spent(self) -> float:
        return self.spent_finished + self.spent_partial

    def over(self, allocation: float | None) -> bool:
        """Whether training the plan would exceed the allocation (a plan with nothing to train never does)."""
        return allocation is not None and self.planned > 0 and self.planned + self.spent > allocation


def estimate(
    runs: list[Run], gpus: int, gpu_type: str, calibration: Calibration, queued: frozenset[Path] = frozenset()
) -> list[Estimate]:
    """The remaining cost of each planned run; `queued` holds the directories of runs with a live job."""
    gpu = gpu_type if gpus else "cpu"
    out = []
    for run in runs:
        rate, source = calibration.rate(run.config, gpu, ranks_per_gpu(run.config, gpus))
        total = run.config.total_steps
        status = runstate.next_launch(run.directory, run.directory in queued)
        progress = runfiles.progress(run.directory)
        done = total if status in ("finished", "diverged") else progress.steps if progress else 0
        out.append(Estimate(run, status, max(total - done, 0), gpus, rate, source))
    return out


def spent(results: str | Path, gpu_type: str, calibration: Calibration) -> tuple[float, float]:
    """GPU-hours already used under `results`: finished runs as measured, unfinished ones from their checkpoints."""
    finished = finished_runs(results, calibration)
    measured = sum(r.gpu_hours for r in finished)
    done = {r.directory for r in finished}
    partial = 0.0
    for config_file in sorted(Path(results).glob("*/*/seed*/config.yaml")):
        run_dir = config_file.parent
        progress = runfiles.progress(run_dir)
        if run_dir in done or progress is None or progress.world < 1:
            continue
        try:
            config = load_config(config_file)
        except ConfigError:
            continue
        try:
            line = runfiles.progress_line(run_dir)
        except runfiles.RunStateError:  # a damaged progress line: the checkpoint still counts
            line = None
        if line is not None and line.gpus == 0:  # trained on CPUs (the local profile's runs share `results`)
            continue
        gpus = progress.world if gpu_type != "cpu" else 0
        rate, _ = calibration.rate(config, gpu_type if gpus else "cpu", ranks_per_gpu(config, gpus))
        if gpus and math.isfinite(rate):
            partial += progress.steps / rate
    return measured, partial


def make_budget(
    runs: list[Run], gpus: int, gpu_type: str, calibration: Calibration, limits: Limits, results: str | Path,
    queued: frozenset[Path] = frozenset(),
) -> Budget:  # fmt: skip
    """The plan's budget on `gpus` GPUs per run of `gpu_type` (a type of the calibration table's `gpus`)."""
    if gpus and gpu_type not in calibration.gpus:
        raise ValueError(
            f"budget.gpu: {gpu_type} is not a GPU of the calibration table ({', '.join(calibration.gpus)})"
        )
    measured, partial = spent(results, gpu_type if gpus else "cpu", calibration)
    layouts = price_layouts(runs, gpu_type, calibration, queued) if gpus else []
    estimates = estimate(runs, gpus, gpu_type, calibration, queued)
    return Budget(estimates, measured, partial, limits, calibration, layouts, gpus)


# -- the report -------------------------------------------------------------------------------------
def _h(value: float, width: int = 9, digits: int = 1) -> str:
    return f"{value:>{width},.{digits}f}" if math.isfinite(value) else f"{'?':>{width}}"


def report(budget: Budget, allocation: float | None, dryrun: bool = True) -> str:
    """The budget, per experiment and variant, with subtotals, the hours spent and the total."""
    estimates = budget.estimates
    counts = defaultdict(int)
    for e in estimates:
        counts[e.status] += 1
    statuses = ", ".join(
        f"{counts[s]} {s}" for s in ("new", "resumes", "in queue", "diverged", "finished") if counts[s]
    )
    out = [f"GPU-hour budget of Snakemake's plan: {len(estimates)} train jobs ({statuses or 'none'})"]
    # names whole, however long a grid makes them: two variants never share a row
    width = max(
        [40, *(len(e.run.variant) for e in estimates), *(len(f"subtotal {e.run.experiment}") for e in estimates)]
    )
    if estimates:
        out.append(
            f"  {'experiment / variant':<{width + 4}}{'runs':>5}  {'status':<9}{'GPUs':>5}{'h/run':>8}{'attempts':>9}"
            f"{'GPU-h':>11}  estimate"
        )
    groups: dict[str, dict[tuple[str, str, str], list[Estimate]]] = defaultdict(lambda: defaultdict(list))
    for e in estimates:
        groups[e.run.experiment][(e.run.variant, e.status, e.source)].append(e)
    for experiment, lines in groups.items():
        out.append(f"  {experiment}")
        subtotal = 0.0
        for (variant, status, source), members in lines.items():
            hours = max(e.wall_hours for e in members)
            gpu_hours = sum(e.gpu_hours for e in members)
            subtotal += gpu_hours if math.isfinite(gpu_hours) else 0.0
            attempts = budget.limits.attempts(hours) if status not in ("finished", "diverged") else 0
            shown_source = {"finished": "only the marker is written", "diverged": "not trained again"}.get(
                status, source
            )
            out.append(
                f"    {variant:<{width}}{len(members):>5}  {status:<9}{members[0].gpus:>5}{_h(hours, 8)}"
                f"{attempts:>9}{_h(gpu_hours, 11)}  {shown_source}"
            )
        count = sum(len(members) for members in lines.values())
        out.append(f"    {'subtotal ' + experiment:<{width}}{count:>5}{'':<31}{_h(subtotal, 11)}")
    out += _legend(budget)
    out += layout_lines(budget)
    out.append(total_line(budget, allocation, warn=dryrun))
    return "\n".join(out)


def layout_lines(budget: Budget) -> list[str]:
    """The plan in both layouts, each checked against the GPU's memory, and the cheaper that fits."""
    if not budget.layouts:
        return []
    layouts = budget.layouts
    memory = layouts[0].memory_gib
    runs = sum(1 for e in budget.estimates if e.run.config.ranks == layouts[0].ranks and e.remaining_steps)
    gib = "memory unknown" if memory is None else f"{memory:g} GiB a GPU"
    lines = [f"  layouts of the {runs} runs of {layouts[0].ranks} ranks to train ({gib}):"]
    for layout in layouts:
        peak = "peak not measured" if layout.peak_gib is None else f"{layout.peak_gib:g} GiB a process"
        fits = {True: "fits", False: "does NOT fit", None: "fit unknown"}[layout.fits]
        chosen = "  <- this plan" if layout.gpus_per_node == budget.gpus_per_node else ""
        label = f"gpus_per_node: {layout.gpus_per_node} ({layout.name})"
        hours = f"{_h(layout.gpu_hours, 9)} GPU-h, {_h(layout.wall_hours, 0)} h a run"
        lines.append(f"    {label:<40}{hours}, {peak}: {fits}{chosen}")
    best = cheapest(layouts)
    if best is None:
        lines.append(
            "    cheaper that fits: unknown (a peak not measured, or none fits): gpu_check on this GPU type measures it"
        )
    elif best.gpus_per_node == budget.gpus_per_node:
        lines.append(f"    cheaper that fits: gpus_per_node: {best.gpus_per_node}, this plan's")
    else:
        lines.append(
            f"    cheaper that fits: gpus_per_node: {best.gpus_per_node} ({best.name}), not this plan's "
            f"(launcher.gpus_per_node: {budget.gpus_per_node}): docs/cluster.md says how to choose"
        )
    current = next((layout for layout in layouts if layout.gpus_per_node == budget.gpus_per_node), None)
    if current is not None and current.fits is False:
        advice = f"set launcher.gpus_per_node: {best.gpus_per_node}" if best else "no layout fits this GPU"
        lines.append(
            f"  WARNING: a process of this plan's layout peaks at {current.peak_gib:g} GiB, over the GPU's "
            f"{current.memory_gib:g} GiB: {advice}"
        )
    return lines


def _legend(budget: Budget) -> list[str]:
    if budget.estimates and not any(e.gpus for e in budget.estimates):  # local runs on a CPU: no GPU, no SLURM job
        return [
            "  on a CPU: the hours a run takes, from finished runs of the same key (the median); `not measured yet` "
            "until one finishes; no GPU-hours are spent"
        ]
    paper = budget.calibration.paper
    costs = ", ".join(f"{k} x{v:g}" for k, v in sorted(budget.calibration.relative_cost.items()))
    limits = budget.limits
    lines = [
        f"  paper: Appendix C, {paper.gpu_hours_per_seed:g} GPU-h per seed of {paper.steps_per_seed:,} steps on "
        f"{paper.gpu} in {paper.dtype} ({paper.steps_per_gpu_hour:,.0f} steps per GPU-h)",
        f"  scaled estimate: the paper's rate x the run's steps x its algorithm's relative cost ({costs or 'none'}); "
        f"measured: the median of finished runs",
    ]
    if any(e.source.startswith(GPU_CHECK) for e in budget.estimates):
        lines.append(
            f"  {GPU_CHECK} <date>: one process's environment steps/s on a GPU of this type (`on <type> xN`: of "
            f"another, x the ratio of their dense peaks) in the run's dtype and weights at the paper's per-rank "
            f"settings, holding as many ranks as the run's processes do (`one rank per GPU's for N`: one, which a "
            f"process of N is at least as fast as), measured by `python -m sacglam_core.benchmarks.gpu_check` "
            f"({budget.calibration.rates_folder}/<type>.yaml), x3,600 per GPU-hour, for any steps, environment or "
            f"model as the scaled estimate; steady unless marked `whole run` (with the first steps, which only act, "
            f"and the first calls, which compile); `from <algorithm> xN`: another algorithm's rate x their relative "
            f"costs"
        )
    if any(e.source.startswith(PEAK_RATIO) for e in budget.estimates):
        reference = budget.calibration.gpus[paper.gpu].tflops[paper.dtype]
        lines.append(
            f"  {PEAK_RATIO} (nothing measured on this GPU type yet): the scaled estimate x the GPU's dense peak "
            f"TFLOP/s at the run's dtype / the {paper.gpu}'s {reference:g} in {paper.dtype} (calibration table's "
            f"gpus): the paper's implementation scaled by peaks, not this code (on an H200 this code ran faster than "
            f"the rule); gpu_check on this GPU type measures it (docs/cluster.md)"
        )
    lines += [
        f"  attempts: SLURM jobs per run at {limits.hours_per_attempt:.2f} h of training each (launcher.time_min="
        f"{limits.time_min} minus signal_delay_s={limits.signal_delay_s}); each resumes from the last checkpoint",
    ]
    lines += _requeue_warning(budget)
    lines.append(
        f"  already spent: {budget.spent_finished:,.1f} GPU-h by finished runs (measured) + "
        f"{budget.spent_partial:,.1f} GPU-h by the checkpointed part of unfinished runs (estimated)"
    )
    return lines


def _requeue_warning(budget: Budget) -> list[str]:
    limits = budget.limits
    worst = max((limits.attempts(e.wall_hours) for e in budget.estimates if e.status != "finished"), default=0)
    if worst <= limits.max_requeues + 1:
        return []
    return [
        f"  WARNING: a run needs {worst} attempts but launcher.max_requeues={limits.max_requeues} allows "
        f"{limits.max_requeues + 1}: raise max_requeues or time_min"
    ]


def summary(budget: Budget, allocation: float | None, finished: dict[str, int]) -> str:
    """The end of a dry run: per experiment (`finished`: its runs already trained) the runs to train and their
    GPU-hours, then the total and the budget's warnings."""
    to_train: dict[str, int] = defaultdict(int)
    gpu_hours: dict[str, float] = defaultdict(float)
    for e in budget.estimates:
        if e.status != "finished":
            to_train[e.run.experiment] += 1
            gpu_hours[e.run.experiment] += e.gpu_hours if math.isfinite(e.gpu_hours) else 0.0
    width = max([40, *map(len, finished)])
    out = [
        "Summary of this dry run (the budget in full is above):",
        f"  {'experiment':<{width}}{'to train':>10}{'finished':>10}{'GPU-h':>11}",
    ]
    for experiment, done in finished.items():
        out.append(f"  {experiment:<{width}}{to_train[experiment]:>10}{done:>10}{_h(gpu_hours[experiment], 11)}")
    return "\n".join([*out, *layout_lines(budget), total_line(budget, allocation), *_requeue_warning(budget)])


def total_line(budget: Budget, allocation: float | None, warn: bool = True) -> str:
    runs = sum(e.status != "finished" for e in budget.estimates)
    line = (
        f"  total: {runs} runs to train, {budget.planned:,.1f} GPU-hours planned + {budget.spent:,.1f} spent = "
        f"{budget.planned + budget.spent:,.1f}"
    )
    if allocation is None:
        return line + " (no allocation set: budget.allocation_gpu_hours)"
    line += f" of the allocation's {allocation:,.1f} (budget.allocation_gpu_hours)"
    if warn and budget.over(allocation):
        line += (
            f"\n  WARNING: {budget.planned + budget.spent:,.1f} GPU-hours is over the allocation of {allocation:,.1f} "
            f"(budget.allocation_gpu_hours): a real run refuses to start"
        )
    return line


def check_allocation(budget: Budget, allocation: float | None) -> None:
    if budget.over(allocation):
        raise BudgetExceededError(
            f"the plan needs {budget.planned:,.1f} GPU-hours and {budget.spent:,.1f} are already spent: "
            f"{budget.planned + budget.spent:,.1f} is over the allocation of {allocation:,.1f} "
            f"(budget.allocation_gpu_hours); launch fewer experiments or seeds, or raise the allocation"
        )


def write_calibration(table: str | Path, results: str | Path, out: str | Path, log: str | Path) -> None:
    """The measured throughput of finished runs per key (the `calibration` rule's output)."""
    import yaml

    from sacglam_core.atomic import write_text

    calibration = load_calibration(table, results)
    measured = {k: round(statistics.median(v), 1) for k, v in sorted(calibration.measured.items())}
    summary = {
        "paper_steps_per_gpu_hour": calibration.paper.steps_per_gpu_hour,
        "relative_cost": calibration.relative_cost,
        "measured_steps_per_gpu_hour": measured,
        "measured_runs": {k: len(v) for k, v in sorted(calibration.measured.items())},
    }
    write_text(out, yaml.safe_dump(summary, sort_keys=False))
    write_text(log, f"calibration from {sum(map(len, calibration.measured.values()))} finished runs\n")
