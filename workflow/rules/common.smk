# The workflow's settings, its runs, the driver that submits them and Snakemake's plan, read at parse time.
# Light imports only (no torch, transformers, pandas or matplotlib): a dry run of the paper's grid stays fast.
import logging
import shlex
import sys
from pathlib import Path

from sacglam_core.jobs import staging
from sacglam_core.jobs.budget import write_calibration
from sacglam_core.pipeline.config import WorkflowConfigError, load_workflow_config, refuse_snakemake_resources
from sacglam_core.jobs.driver import Driver
from sacglam_core.pipeline.experiments import ExperimentError, expand, load_definitions
from sacglam_core.reports.outputs import expected_outputs
from sacglam_core.jobs.plan import Plan, PlanListener
from sacglam_core.runfiles import MARKER

PYTHON = sys.executable  # the workflow's own interpreter (the project's virtualenv)
try:
    SETTINGS = load_workflow_config(workflow.config_settings.configfiles, workflow.config_settings.config)
    _resources = workflow.resource_settings
    refuse_snakemake_resources(
        SETTINGS,
        {
            "--default-resources": list((_resources.default_resources or {}).keys()),
            "--set-resources": [name for rule in _resources.overwrite_resources.values() for name in rule.keys()],
        },
    )
    DEFINITIONS = load_definitions(*SETTINGS.definition_files)
    RUNS = expand(DEFINITIONS, SETTINGS.experiments, Path(SETTINGS.results), {"models": SETTINGS.models})
    MODEL_INPUTS = {str(run.directory): staging.model_inputs(run.config.model, SETTINGS) for run in RUNS}
    PLAN = Plan(SETTINGS, RUNS)
except (WorkflowConfigError, ExperimentError, ValueError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
DEFINITION_FILES = " ".join(map(shlex.quote, SETTINGS.definition_files))
RESULTS = Path(SETTINGS.results)
MODELS = Path(SETTINGS.models)
HF_CACHE = Path(SETTINGS.hf_cache)
LAUNCHER = SETTINGS.launcher
RUN_BY_DIR = {str(run.directory): run for run in RUNS}
# What the campaign was launched with, so that `status` finds the same settings without being told the profile.
DRIVER = Driver(
    SETTINGS,
    launch={
        "configfiles": [str(Path(f).resolve()) for f in workflow.config_settings.configfiles],
        "config": dict(workflow.config_settings.config),
    },
)
if workflow.is_main_process:
    logging.getLogger("snakemake.logging").addHandler(PlanListener(PLAN, workflow))


def run_of(wildcards):
    return RUN_BY_DIR[str(RESULTS / wildcards.experiment / wildcards.variant / f"seed{wildcards.seed}")]


def marker(run):
    return str(run.directory / MARKER)


def runs_of(name):
    return [run for run in RUNS if run.experiment == name]


def aggregate_outputs(name):
    return [str(p) for p in expected_outputs(name, DEFINITIONS["experiments"][name], RESULTS)]


def report_if_present(path, **kwargs):
    """Files a `--report` shows: those that exist (a campaign in progress has not made them all yet)."""
    return report(path, **kwargs) if Path(path).exists() else path


def train_threads(wildcards):
    """Cores a local run occupies, its torch threads (all cores when unset): Snakemake then never starts more
    runs at once than `--cores` holds, and threads never oversubscribe them. A SLURM run waits in one thread."""
    if LAUNCHER.executor != "local":
        return 1
    return min(run_of(wildcards).config.threads or workflow.cores, workflow.cores)


def train_priority(wildcards):
    """Longest runs first: with more runs than cores, the short ones then fill the cores at the end instead of
    one long run holding up the campaign alone (longest-processing-time scheduling)."""
    return PLAN.calibration.work(run_of(wildcards).config)


def train_inputs(wildcards):
    """The run's model and the image: `ancient`, so that rebuilding them never re-runs a finished run."""
    run = run_of(wildcards)
    image = [LAUNCHER.container] if LAUNCHER.container else []
    return [ancient(path) for path in (*MODEL_INPUTS[str(run.directory)], *image)]


onstart:
    PLAN.start(workflow, DRIVER)
