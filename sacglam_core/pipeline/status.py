"""A campaign's state, run by run, from the files the runs and the driver write; it changes nothing (no SLURM
command but `squeue`, no lock taken), so it works while the driver runs or after it has gone.

    python -m sacglam_core.pipeline.status --profile profiles/slurm            # the profile's experiments
    python -m sacglam_core.pipeline.status --profile profiles/local mini smoke  # these experiments
    python -m sacglam_core.pipeline.status --config results=/scratch/results    # other settings, as --config

Each run is `finished`, `running` (steps done, steps/s, job id, ETA), `queued` (its SLURM job waits), `stopped`
(checkpointed, no live job: the next launch resumes it), `failed` (its job ended before the run finished: its
last error line), or `not started`; then the totals per experiment, GPU-hours spent included (finished runs as
measured, unfinished ones from their progress).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from sacglam_core.lease import LEASE_FILE
from sacglam_core.pipeline import runstate, slurm, yamlfile
from sacglam_core.pipeline.config import WorkflowConfig, WorkflowConfigError, load_workflow_config
from sacglam_core.pipeline.experiments import ExperimentError, Run, expand, load_definitions

EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")  # a traceback's last line
STATES = ("finished", "running", "queued", "stopped", "failed", "not started")


@dataclass(frozen=True)
class RunStatus:
    run: Run
    state: str
    steps: int
    total: int
    steps_per_s: float | None = None
    job: str = ""
    gpu_hours: float = 0.0
    note: str = ""


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def alive(record: dict | None) -> bool:
    """Whether the process of a lease record still runs (only checkable on its own host)."""
    if not record or record.get("host") != socket.gethostname() or not record.get("pid"):
        return False
    try:
        os.kill(int(record["pid"]), 0)
    except (OSError, ValueError):
        return False
    return True


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


def status_of(run: Run, queue: dict[str, tuple[str, str]] | None) -> RunStatus:
    """One run's state; `queue` is squeue's (None where SLURM is not reachable)."""
    directory, total = run.directory, run.config.total_steps
    summary = read_json(directory / runstate.DONE)
    if summary is not None:
        hours = summary.get("wall_seconds", 0) / 3600
        gpus = int(summary.get("gpus") or 0)
        return RunStatus(run, "finished", total, total, gpu_hours=hours * gpus, job=_job_id(directory),
                         note=f"final success {summary.get('eval_success', float('nan')):.3f}")  # fmt: skip
    progress = read_json(directory / runstate.PROGRESS) or {}
    checkpoint = runstate.progress(directory)
    steps = max(int(progress.get("env_steps", 0)), checkpoint.steps if checkpoint else 0)
    gpu_hours = progress.get("wall_seconds", 0) / 3600 * int(progress.get("gpus") or 0)
    record = runstate.read_job(directory) or {}
    job_id = str(record.get("job_id", ""))
    state = queue.get(job_id, ("", ""))[0] if queue is not None and job_id else ""
    lease = read_json(directory / LEASE_FILE)
    if state == "RUNNING" or (not state and alive(lease)):
        rate = progress.get("steps_per_s")
        eta = progress.get("eta_s")
        note = f"ETA {eta / 60:.0f} min" if eta is not None else ""
        if progress.get("time"):
            note += f"{', ' if note else ''}last progress {(time.time() - progress['time']) / 60:.0f} min ago"
        return RunStatus(run, "running", steps, total, rate, job_id or f"pid {lease.get('pid')}", gpu_hours, note)
    if state in slurm.LIVE:
        return RunStatus(run, "queued", steps, total, job=job_id, gpu_hours=gpu_hours, note=state)
    ended = record.get("ended") or ""
    if job_id and ((ended and ended != "COMPLETED") or (queue is not None and not state and not steps)):
        return RunStatus(run, "failed", steps, total, job=job_id, gpu_hours=gpu_hours,
                         note=f"{ended or 'ended'}: {last_error(directory, job_id)}")  # fmt: skip
    if steps:
        return RunStatus(
            run, "stopped", steps, total, job=job_id, gpu_hours=gpu_hours, note="resumes at the next launch"
        )
    return RunStatus(run, "not started", 0, total)


def _job_id(directory: Path) -> str:
    record = runstate.read_job(directory)
    return str(record["job_id"]) if record else "local"


def report(statuses: list[RunStatus], results: str) -> str:
    out = [f"{len(statuses)} runs under {results} at {time.strftime('%Y-%m-%d %H:%M')}"]
    out.append(f"  {'run':<52}{'state':<12}{'steps':>22}{'steps/s':>9}  {'job':<10}{'GPU-h':>8}  note")
    for s in statuses:
        name = f"{s.run.experiment}/{s.run.directory.parent.name}/{s.run.directory.name}"
        steps = f"{s.steps:,}/{s.total:,} ({100 * s.steps / s.total:.0f}%)"
        rate = f"{s.steps_per_s:.2f}" if s.steps_per_s is not None else ""
        out.append(f"  {name[:51]:<52}{s.state:<12}{steps:>22}{rate:>9}  {s.job[:10]:<10}{s.gpu_hours:>8.1f}  {s.note}")
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


def settings_of(profile: str, overrides: dict) -> WorkflowConfig:
    """The workflow's settings as `snakemake --profile <profile>` reads them (its configfile, then its cluster
    file)."""
    profile_dir = Path(profile)
    raw = yamlfile.load(profile_dir / "config.yaml", "Snakemake profile")
    configfiles = raw.get("configfile") or []
    configfiles = [configfiles] if isinstance(configfiles, str) else configfiles
    resolved = [str(profile_dir / f) if (profile_dir / f).exists() else f for f in configfiles]
    return load_workflow_config(resolved, overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sacglam_core.pipeline.status", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("experiments", nargs="*", help="experiments to show (default: the profile's)")
    parser.add_argument("--profile", default="profiles/slurm", help="the Snakemake profile the campaign runs with")
    parser.add_argument("--results", help="the results folder (default: the profile's)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE", help="as Snakemake's --config")
    args = parser.parse_args(argv)
    overrides = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.config)}
    if args.experiments:
        overrides["experiments"] = args.experiments
    if args.results:
        overrides["results"] = args.results
    try:
        settings = settings_of(args.profile, overrides)
        definitions = load_definitions(*settings.definition_files)
        runs = expand(definitions, settings.experiments, Path(settings.results), {"models": settings.models})
    except (WorkflowConfigError, ExperimentError, yamlfile.YamlFileError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
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
