# Experiments expanded into runs, the launcher's settings and the GPU-hour budget, read at parse time.
import sys
from pathlib import Path

from sacglam_core.pipeline import budget as budgeting
from sacglam_core.pipeline.config import parse_workflow_config
from sacglam_core.pipeline.experiments import expand, load_definitions

PYTHON = sys.executable  # the workflow's own interpreter (the project's virtualenv)
SETTINGS = parse_workflow_config(config)
RESULTS = Path(SETTINGS.results)
MODELS = Path(SETTINGS.models)
HF_CACHE = Path(SETTINGS.hf_cache)
LAUNCHER = SETTINGS.launcher
BUDGET = SETTINGS.budget
RUNS = expand(load_definitions(SETTINGS.experiment_file), SETTINGS.experiments, RESULTS, {"models": str(MODELS)})
RUN_BY_DIR = {str(run.directory): run for run in RUNS}
GPUS_PER_RUN = LAUNCHER.gpus_per_node if LAUNCHER.executor == "slurm" else 0


def run_output(run):
    return str(run.directory / "done.json")


def plan():
    calibration = budgeting.load_calibration(BUDGET.calibration, RESULTS)
    return budgeting.plan(RUNS, GPUS_PER_RUN, BUDGET.gpu_name, calibration)


if workflow.is_main_process:
    finished = sum((run.directory / "done.json").exists() for run in RUNS)
    print(budgeting.report(plan(), finished, BUDGET.allocation_gpu_hours), file=sys.stderr)


onstart:
    budgeting.check_allocation(plan(), BUDGET.allocation_gpu_hours)
