"""Snakemake's plan: the `train` jobs it will run (its DAG's needrun jobs), their budget and the preflight.

Snakemake announces its plan with a RUN_INFO log event as soon as the DAG is built, in a dry run and in a
real run alike, before any job starts and before `onstart`. `PlanListener` prints the budget of exactly those
jobs then, and after the last line of a dry run a summary: per experiment, the runs to train, those finished
and their GPU-hours, the total and every warning again.
In a real run `Plan.enforce` (from `onstart`) refuses to start, before anything is submitted, when the plan
is over the allocation or the preflight fails; a dry run prints the same problems as warnings. Snakemake
never plans `train` for `figures` or `--report`, so these are never refused.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from sacglam_core import runfiles
from sacglam_core.jobs import budget as budgeting
from sacglam_core.jobs import runstate, slurm
from sacglam_core.jobs.driver import DriverError, say
from sacglam_core.pipeline.config import WorkflowConfig, settings_file
from sacglam_core.pipeline.experiments import Run

TRAIN_RULE = "train"
DRY_RUN_END = "This was a dry-run"  # Snakemake's last line of a dry run, an event-less message


class Plan:
    def __init__(self, settings: WorkflowConfig, runs: list[Run]) -> None:
        self.settings = settings
        self.by_directory = {str(run.directory): run for run in runs}
        self.cluster_file = settings_file(settings)
        # Read once: it prices the plan and orders the runs (train's priority). ValueError for a bad table.
        self.calibration = budgeting.load_calibration(settings.budget.calibration, settings.results)
        gpu = settings.budget.gpu
        if settings.launcher.executor == "slurm" and gpu not in self.calibration.gpus:
            raise ValueError(
                f"{settings.origin('budget.gpu')}: budget.gpu: {gpu} is not a GPU of {settings.budget.calibration} "
                "(one of "
                f"{', '.join(self.calibration.gpus)}; add its peak TFLOP/s there to budget another)"
            )
        self._budget: budgeting.Budget | None = None
        self._warnings: list[str] | None = None  # the preflight's, once announced

    def runs(self, dag) -> list[Run]:
        """The runs of the `train` jobs Snakemake will run, in the order of the experiment definitions."""
        planned = {str(Path(job.output[0]).parent) for job in dag.needrun_jobs() if job.rule.name == TRAIN_RULE}
        return [run for directory, run in self.by_directory.items() if directory in planned]

    def budget(self, dag) -> budgeting.Budget:
        if self._budget is None:
            launcher, budget = self.settings.launcher, self.settings.budget
            gpus = launcher.gpus_per_node if launcher.executor == "slurm" else 0
            runs = self.runs(dag)
            self._budget = budgeting.make_budget(
                runs,
                gpus,
                budget.gpu,
                self.calibration,
                budgeting.Limits(launcher.time_min, launcher.signal_delay_s, launcher.max_requeues),
                self.settings.results,
                queued=self._queued(runs),
            )
        return self._budget

    def _queued(self, runs: list[Run]) -> frozenset[Path]:
        """Runs whose recorded job is still in the queue (the driver re-attaches to these)."""
        records = {run.directory: runstate.read_job(run.directory) for run in runs}
        if self.settings.launcher.executor != "slurm" or not any(records.values()) or not slurm.available():
            return frozenset()
        try:
            queue = slurm.queue()
        except slurm.SlurmError:
            return frozenset()
        return frozenset(d for d, r in records.items() if r and queue.get(str(r["job_id"]), ("",))[0] in slurm.LIVE)

    def to_train(self, dag) -> list[Run]:
        return [e.run for e in self.budget(dag).estimates if e.status != "finished"]

    # -- what Snakemake calls ------------------------------------------------------------------------
    def announce(self, workflow) -> None:
        """Print the budget and, in a dry run, the preflight's warnings; once (a dry run announces twice)."""
        if self._warnings is not None:
            return
        budget = self.budget(workflow.dag)
        problems = self.preflight(workflow.dag) if workflow.dryrun else []
        self._warnings = [f"  WARNING: preflight: {problem}; a real run refuses to start" for problem in problems]
        self._warnings += [f"  WARNING: {warning}" for warning in self.mixed_gpus(self.to_train(workflow.dag))]
        report = budgeting.report(budget, self.settings.budget.allocation_gpu_hours, workflow.dryrun)
        say("\n".join([report, *self._warnings]))

    def conclude(self, workflow) -> None:
        """The end of a dry run: the summary per experiment, the total and every warning again."""
        finished = dict.fromkeys((run.experiment for run in self.by_directory.values()), 0)
        for run in self.by_directory.values():
            finished[run.experiment] += any((run.directory / f).exists() for f in (runfiles.DONE, runfiles.MARKER))
        allocation = self.settings.budget.allocation_gpu_hours
        summary = budgeting.summary(self.budget(workflow.dag), allocation, finished)
        say("\n".join(["", summary, *(self._warnings or [])]))  # none when announce failed

    def start(self, workflow, driver) -> None:
        """Snakemake's onstart: refuse (one line, status 2) or start the driver; nothing was submitted yet."""
        try:
            driver.start(training=self.enforce(workflow))
        except (budgeting.BudgetExceededError, DriverError, runfiles.RunStateError) as error:
            say(f"error: {error}")
            raise SystemExit(2) from None

    def enforce(self, workflow) -> bool:
        """Before the first job (onstart): the allocation and the preflight. Whether training is planned."""
        budget = self.budget(workflow.dag)
        budgeting.check_allocation(budget, self.settings.budget.allocation_gpu_hours)
        problems = self.preflight(workflow.dag)
        if problems:
            raise DriverError("preflight: " + "; ".join(problems))
        return bool(budget.estimates)

    # -- preflight ---------------------------------------------------------------------------------
    def preflight(self, dag) -> list[str]:
        """What would make the planned jobs fail after queueing, found before submitting any."""
        runs = self.to_train(dag)
        launcher = self.settings.launcher
        problems = [self._ranks(run) for run in runs]
        problems = [p for p in problems if p]
        if runs and launcher.executor == "slurm":
            if not launcher.partition:
                problems.append(
                    f"{self.settings.origin('launcher.partition')}: launcher.partition is not set; SLURM would use its "
                    "default partition "
                    f"(`sinfo -s` lists them)"
                )
            if not slurm.available():
                problems.append(
                    "launcher.executor is slurm but sbatch, squeue or sacct is not on PATH: run this on the "
                    "cluster's login node, or use --profile profiles/local"
                )
            elif not problems:
                problems += self._test_only(runs[0])
        return problems

    def mixed_gpus(self, runs: list[Run]) -> list[str]:
        """A partition of GPU types on which `dtype: auto` computes differently, with no `gres_type` or `constraint`
        to pin one: a variant's seeds could then run in different dtypes."""
        launcher = self.settings.launcher
        auto = [run for run in runs if run.config.model.dtype == "auto"]
        if launcher.executor != "slurm" or launcher.gres_type or launcher.constraint or not auto:
            return []
        if not launcher.partition or not slurm.available():
            return []
        try:
            types = sorted(slurm.gpu_types(launcher.partition))
        except slurm.SlurmError:
            return []
        return mixed_dtypes(
            types, auto[0], self.calibration, launcher.partition, self.settings.origin("launcher.partition")
        )

    def _ranks(self, run: Run) -> str | None:
        progress = runfiles.progress(run.directory)
        ranks = self.settings.launcher.ranks if self.settings.launcher.executor == "slurm" else 1
        if run.config.ranks and run.config.ranks % ranks:
            return (
                f"{run.directory}: its {run.config.ranks} data-parallel ranks (`ranks`) cannot be shared out among the "
                f"{ranks} processes launcher.gpus_per_node gives "
                f"({self.settings.origin('launcher.gpus_per_node')}): use a divisor of "
                f"{run.config.ranks} (1 holds them all on one GPU)"
            )
        if progress is None or progress.world == ranks:
            return None
        return (
            f"{run.directory} was checkpointed by {progress.world} ranks ({progress.manifest.name}) but "
            f"launcher.gpus_per_node gives {ranks}: resume it with the same GPUs per node "
            f"({self.settings.origin('launcher.gpus_per_node')}), "
            f"or move it aside to start over"
        )

    def _test_only(self, run: Run) -> list[str]:
        from sacglam_core.jobs.launch import submission_script

        launcher = self.settings.launcher
        with tempfile.TemporaryDirectory(prefix="sacglam-preflight-") as tmp:
            script = Path(tmp) / "preflight.sh"
            script.write_text(submission_script(Path(tmp), launcher))
            try:
                accepted, message = slurm.test_only(str(script))
            except slurm.SlurmError as error:
                return [str(error)]
        if accepted:
            return []
        options = ", ".join(
            f"{k}={v}"
            for k, v in [("partition", launcher.partition), ("account", launcher.account), ("qos", launcher.qos),
                         ("constraint", launcher.constraint), ("gpus_per_node", launcher.gpus_per_node),
                         ("gres_type", launcher.gres_type), ("time_min", launcher.time_min),
                         ("mem_gb", launcher.mem_gb), *launcher.sbatch_options.items()]
            if v is not None
        )  # fmt: skip
        return [f"sbatch --test-only rejected the training jobs' options ({options}; {self.cluster_file}): {message}"]


def mixed_dtypes(
    types: list[str], run: Run, calibration: budgeting.Calibration, partition: str, cluster_file: str
) -> list[str]:
    """The warning for a partition whose GPU types (`types`, from sinfo) give `run` different dtypes (an unknown
    type counts as different)."""
    dtypes = {gres_type: calibration.dtype_on(gres_type, run.config) or "unknown" for gres_type in types}
    if len(types) < 2 or (len(set(dtypes.values())) == 1 and "unknown" not in dtypes.values()):
        return []
    found = ", ".join(f"{gres_type} ({dtype})" for gres_type, dtype in dtypes.items())
    return [
        f"partition {partition} mixes GPU types with dtype: auto computing differently on them, {found}: a "
        f"variant's seeds could differ in precision; pin one with launcher.gres_type or launcher.constraint "
        f"({cluster_file})"
    ]


class PlanListener(logging.Handler):
    """Calls `plan.announce(workflow)` on each RUN_INFO event of Snakemake's log and when it has nothing to do,
    `plan.conclude(workflow)` on the last line of a dry run."""

    def __init__(self, plan: Plan, workflow) -> None:
        super().__init__(level=logging.DEBUG)
        self.plan, self.workflow = plan, workflow

    def emit(self, record: logging.LogRecord) -> None:
        from snakemake.common import NOTHING_TO_BE_DONE_MSG

        message = record.getMessage()
        try:
            if str(getattr(record, "event", "")) == "run_info" or message == NOTHING_TO_BE_DONE_MSG:
                self.plan.announce(self.workflow)
            elif message.startswith(DRY_RUN_END):
                self.plan.conclude(self.workflow)
        except Exception as error:  # a logging handler must not raise; onstart checks again and fails loudly
            say(f"GPU-hour budget: not available ({error})")
