"""A campaign's state, run by run, from the files the runs and the driver write; it changes nothing (no SLURM
command but `squeue`; no lock but the shared flock it takes for a moment on a run's lease to see whether a trainer
holds it, as the driver does), so it works while the driver runs or after it has gone.

    python -m sacglam_core.jobs.status                                     # the campaign launched last
    python -m sacglam_core.jobs.status --profile profiles/slurm            # the profile's experiments
    python -m sacglam_core.jobs.status --profile profiles/local mini smoke  # these experiments
    python -m sacglam_core.jobs.status --config results=/scratch/results    # other settings, as --config

Without `--profile` it reads the settings the last launch on the results folder used (`<results>/.driver/
launch.json`, `results` unless `--results` names another), else the one profile of `profiles/` with a cluster
file; it names the profiles to choose from when there are several.

Each run is `finished`, `running` (steps done, steps/s, job id, ETA), `queued` (its SLURM job waits), `stopped`
(checkpointed, no live job: the next launch resumes it), `diverged` (its training went non-finite: where, and its
last finite checkpoint; no launch trains it again), `failed` (its job ended before the run finished: its
last error line), `damaged` (a file of it cannot be read: which, the key and the value, and what the next launch
does about it) or `not started`; then the totals per experiment, GPU-hours spent included (finished runs as
measured, unfinished ones from their progress).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from sacglam_core import runfiles
from sacglam_core.jobs import runstate, slurm
from sacglam_core.jobs.driver import LAUNCH_FILE
from sacglam_core.lease import LEASE_FILE, holder
from sacglam_core.monitor import duration
from sacglam_core.pipeline import yamlfile
from sacglam_core.pipeline.config import DEFAULTS, WorkflowConfig, WorkflowConfigError, load_workflow_config
from sacglam_core.pipeline.experiments import ExperimentError, Run, expand, load_definitions

EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")  # a traceback's last line
STATES = ("finished", "running", "queued", "stopped", "diverged", "failed", "damaged", "not started")
# What the next launch does with a run, by runstate.next_launch's word (the budget's), and `refuses`
NEXT = {
    "new": "the next launch starts it",
    "resumes": "the next launch resumes it from its last checkpoint",
    "in queue": "the next launch re-attaches to its job",
    "finished": "the next launch trains nothing",
    "diverged": f"the next launch does not train it: change its settings, or delete its {runfiles.DIVERGED} to retry",
    "refuses": "the next launch refuses to start, for every run, until this is repaired",
}


@dataclass(frozen=True)
class RunStatus:
    run: Run
    state: str
    steps: int
    total: int
    next_launch: str  # what the next launch does with it: a key of NEXT
    steps_per_s: float | None = None
    job: str = ""
    gpu_hours: float = 0.0
    note: str = ""


def last_error(run_dir: Path, job_id: str) -> str:
    """The job's last error line (SLURM's log, then the trainer's): a Python exception's, else one that says
    error, else the last line."""
    for log in [*sorted((run_dir / "slurm").glob(f"{job_id}_*_log.err")), run_dir / "trainer.log"]:
        try:
            lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        exceptions = [line for line in lines if EXCEPTION.match(line)]
        errors = [line for line in lines if "error" in line.lower()]
        if lines:
            return (exceptions or errors or lines)[-1][:160]
    return ""


def next_launch(run_dir: Path, queued: bool) -> str:
    """What the next launch does with the run: nothing once its marker exists (Snakemake plans no train job), else
    what the budget says (runstate.next_launch), or `refuses` to start while its done.json cannot be read."""
    if (run_dir / runfiles.MARKER).exists():
        return "finished"
    try:
        return runstate.next_launch(run_dir, queued)
    except runfiles.RunStateError:
        return "refuses"


def _read(reader, run_dir: Path, problems: list[str]):
    """`reader(run_dir)`, or None with what is wrong added to `problems`."""
    try:
        return reader(run_dir)
    except runfiles.RunStateError as error:
        problems.append(str(error))
        return None


def status_of(run: Run, queue: dict[str, tuple[str, str]] | None) -> RunStatus:
    """One run's state; `queue` is squeue's (None where SLURM is not reachable)."""
    directory, total = run.directory, run.config.total_steps
    problems: list[str] = []
    record = _read(runstate.job_record, directory, problems) or {}
    job_id = record.get("job_id", "")
    state = queue.get(job_id, ("", ""))[0] if queue is not None and job_id else ""
    upcoming = next_launch(directory, state in slurm.LIVE)
    if (directory / runfiles.DONE).exists() or upcoming == "finished":
        if not (directory / runfiles.DONE).exists():
            problems.append(f"{directory / runfiles.MARKER} exists without {runfiles.DONE}; {runfiles.REBUILD}")
        summary = _read(runfiles.summary, directory, problems)
        if summary is not None and not problems:
            success = f"final success {summary.eval_success:.3f}" if summary.eval_success is not None else ""
            hours = summary.wall_seconds / 3600 * summary.gpus
            note = "; ".join(filter(None, [success, summary.device_plan and f"plan: {summary.device_plan}"]))
            return RunStatus(run, "finished", total, total, upcoming, job=job_id or "local", gpu_hours=hours, note=note)
        checkpoint = runfiles.progress(directory)
        steps = total if upcoming == "finished" else checkpoint.steps if checkpoint else 0
        return _damaged(run, steps, upcoming, job_id, 0.0, problems)
    line = _read(runfiles.progress_line, directory, problems)
    checkpoint = runfiles.progress(directory, problems)
    steps = max(line.env_steps if line else 0, checkpoint.steps if checkpoint else 0)
    gpu_hours = line.wall_seconds / 3600 * line.gpus if line else 0.0
    trainer = holder(directory)  # the lease's flock, as the driver judges it: never a pid that may be reused
    if state == "RUNNING" or (not state and trainer is not None):
        notes = [f"ETA {duration(line.eta_s)}"] if line and line.eta_s is not None else []
        if line and line.time is not None:
            notes.append(f"last progress {duration(max(time.time() - line.time, 0))} ago")
        job = job_id or _holder_pid(directory, trainer or {}, problems)
        rate = line.steps_per_s if line else None
        plan = line and line.device_plan and f"plan: {line.device_plan}"
        note = "; ".join(filter(None, [", ".join(notes), plan, *problems]))
        return RunStatus(run, "running", steps, total, upcoming, rate, job, gpu_hours, note)
    if state in slurm.LIVE:
        return RunStatus(run, "queued", steps, total, upcoming, job=job_id, gpu_hours=gpu_hours,
                         note="; ".join([state, *problems]))  # fmt: skip
    if problems:
        return _damaged(run, steps, upcoming, job_id, gpu_hours, problems)
    if upcoming == "diverged":
        message = runfiles.diverged(directory)["message"]
        return RunStatus(run, "diverged", steps, total, upcoming, job=job_id, gpu_hours=gpu_hours, note=message)
    ended = record.get("ended") or ""
    if job_id and ((ended and ended != "COMPLETED") or (queue is not None and not state and not steps)):
        return RunStatus(run, "failed", steps, total, upcoming, job=job_id, gpu_hours=gpu_hours,
                         note=f"{ended or 'ended'}: {last_error(directory, job_id)}")  # fmt: skip
    if steps:
        return RunStatus(run, "stopped", steps, total, upcoming, job=job_id, gpu_hours=gpu_hours, note=NEXT[upcoming])
    return RunStatus(run, "not started", 0, total, upcoming)


def _holder_pid(run_dir: Path, record: dict, problems: list[str]) -> str:
    """`pid <n>` of the lease's holder, from its record (being written: none yet)."""
    try:
        pid = runfiles.value(run_dir / LEASE_FILE, record, "pid", int, None)
    except runfiles.RunStateError as error:
        problems.append(str(error))
        pid = None
    return f"pid {pid}" if pid is not None else "lease held"


def _damaged(run: Run, steps: int, upcoming: str, job: str, gpu_hours: float, problems: list[str]) -> RunStatus:
    """A run with damaged files: what is wrong with each, then what the next launch does about it."""
    note = "; ".join([*problems, NEXT[upcoming]])
    return RunStatus(run, "damaged", steps, run.config.total_steps, upcoming, job=job, gpu_hours=gpu_hours, note=note)


def report(statuses: list[RunStatus], results: str) -> str:
    """One row per run, its name whole (the variant's hash and the seed tell runs apart), then the totals."""
    names = [f"{s.run.experiment}/{s.run.directory.parent.name}/{s.run.directory.name}" for s in statuses]
    width = max([51, *map(len, names)]) + 1
    jobs = max([9, *(len(s.job) for s in statuses)]) + 1
    out = [f"{len(statuses)} runs under {results} at {time.strftime('%Y-%m-%d %H:%M')}"]
    out.append(f"  {'run':<{width}}{'state':<12}{'steps':>22}{'steps/s':>9}  {'job':<{jobs}}{'GPU-h':>8}  note")
    for name, s in zip(names, statuses):
        steps = f"{s.steps:,}/{s.total:,} ({100 * s.steps / s.total:.0f}%)"
        rate = f"{s.steps_per_s:.2f}" if s.steps_per_s is not None else ""
        out.append(f"  {name:<{width}}{s.state:<12}{steps:>22}{rate:>9}  {s.job:<{jobs}}{s.gpu_hours:>8.1f}  {s.note}")
    out.append("totals")
    by_experiment: dict[str, list[RunStatus]] = defaultdict(list)
    for s in statuses:
        by_experiment[s.run.experiment].append(s)
    for experiment, members in by_experiment.items():
        counts = Counter(s.state for s in members)
        states = ", ".join(f"{counts[state]} {state}" for state in STATES if counts[state])
        spent = sum(s.gpu_hours for s in members)
        out.append(f"  {experiment}: {len(members)} runs: {states}; {spent:,.1f} GPU-h spent")
    return "\n".join(out)


def profile_files(profile: str) -> list[str]:
    """The settings files `snakemake --profile <profile>` reads (its configfile, relative to the profile)."""
    profile_dir = Path(profile)
    raw = yamlfile.load(profile_dir / "config.yaml", "Snakemake profile")
    configfiles = raw.get("configfile") or []
    configfiles = [configfiles] if isinstance(configfiles, str) else configfiles
    return [str(profile_dir / f) if (profile_dir / f).exists() else f for f in configfiles]


def settings_of(profile: str, overrides: dict) -> WorkflowConfig:
    """The workflow's settings as `snakemake --profile <profile>` reads them (its configfile, then its cluster
    file)."""
    return load_workflow_config(profile_files(profile), overrides)


def launched_settings(results: str, overrides: dict) -> WorkflowConfig | None:
    """The settings the last launch on `results` used (its settings files and --config), None if none is recorded."""
    record = Path(results) / ".driver" / LAUNCH_FILE
    if not record.is_file():
        return None
    try:
        launch = json.loads(record.read_text())
        files, config = list(launch["configfiles"]), dict(launch.get("config", {}))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{record}: not a record of a launch ({type(error).__name__}: {error}); use --profile"
        ) from None
    return load_workflow_config(files, {**config, **overrides})


def campaign_settings(profile: str | None, results: str | None, overrides: dict) -> WorkflowConfig:
    """A campaign's settings: those of `profile`, else those the last launch on `results` used, else those of the one
    profile of `profiles/` with a cluster file (a ValueError naming the choices where there are several)."""
    settings = None if profile else launched_settings(results or "results", overrides)
    return settings if settings is not None else settings_of(profile or only_profile(), overrides)


def only_profile() -> str:
    """The one profile of `profiles/` with a cluster file; a ValueError naming the choices otherwise."""
    profiles = sorted(p for p in Path("profiles").glob("*") if (p / "config.yaml").is_file())
    with_cluster = [p for p in profiles if (p / "cluster.yaml").is_file()]
    if len(with_cluster) == 1:
        return str(with_cluster[0])
    names = ", ".join(str(p) for p in profiles) or "none"
    raise ValueError(
        f"no launch recorded in results/.driver/ and {len(with_cluster)} profiles with a cluster file: name the "
        f"campaign's with --profile (profiles here: {names})"
    )


def results_origin(args: argparse.Namespace, overrides: dict, settings: WorkflowConfig) -> str:
    """Where the results folder's path comes from: an option, else the settings file that sets it last (the cluster
    file, the profile's, else the workflow's defaults)."""
    if args.results:
        return "--results"
    if "results" in overrides:
        return "--config"
    if not args.profile:
        return f"the last launch's settings ({Path(args.results or 'results') / '.driver' / LAUNCH_FILE})"
    files = [*profile_files(args.profile), *([settings.cluster_file] if settings.cluster_file else [])]
    return next((f for f in reversed(files) if "results" in yamlfile.load(f)), str(DEFAULTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sacglam_core.jobs.status", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("experiments", nargs="*", help="experiments to show (default: the profile's)")
    parser.add_argument(
        "--profile", help="the Snakemake profile the campaign runs with (default: the last launch's, see above)"
    )
    parser.add_argument("--results", help="the results folder (default: the profile's)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="as Snakemake's --config")
    args = parser.parse_args(argv)
    # --config takes every word after it: those without "=" are the experiments that followed it
    config = [item for item in args.config if "=" in item]
    experiments = [*args.experiments, *(item for item in args.config if "=" not in item)]
    overrides = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in config)}
    if experiments:
        overrides["experiments"] = experiments
    if args.results:
        overrides["results"] = args.results
    try:
        settings = None if args.profile else launched_settings(args.results or "results", overrides)
        if settings is None:
            args.profile = args.profile or only_profile()
            settings = settings_of(args.profile, overrides)
        definitions = load_definitions(*settings.definition_files)
        runs = expand(definitions, settings.experiments, Path(settings.results), {"models": settings.models})
    except (WorkflowConfigError, ExperimentError, yamlfile.YamlFileError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not Path(settings.results).is_dir():
        where = results_origin(args, overrides, settings)
        print(f"error: results folder {settings.results} (set by {where}) does not exist: no run started there",
              file=sys.stderr)  # fmt: skip
        return 2
    queue = None
    if settings.launcher.executor == "slurm" and slurm.available():
        try:
            queue = slurm.queue()
        except slurm.SlurmError as error:
            print(f"warning: {error}; job states from the run directories only", file=sys.stderr)
    print(report([status_of(run, queue) for run in runs], settings.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
