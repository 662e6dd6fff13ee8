"""A first job's verdict: what a campaign depends on, checked from the files of the `gpu_smoke` run, one line each.

    .venv/bin/snakemake --profile profiles/slurm --config 'experiments=[gpu_smoke]'
    .venv/bin/python -m sacglam_core.pipeline.gpu_smoke

The run (one seed of SAC-GLAM+HER, Flan-T5-base as the paper's experiments load it, a few hundred steps) stops once
halfway as at a time limit (`checkpoint.drill_at_steps`), is requeued and resumes. Checked, from its done.json,
config.yaml and attempts.jsonl: the image it ran in, the staged model at its pinned commit read offline, the GPU,
the compute dtype, the LoRA adapters trained, the checkpoint and the requeue. Exit status 0 when every check
passes, 1 when one fails, 2 when the run is not there to check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from sacglam_core.pipeline.config import WorkflowConfigError
from sacglam_core.pipeline.experiments import ExperimentError, expand, load_definitions
from sacglam_core.pipeline.status import settings_of
from sacglam_core.runfiles import RunStateError, finished


def checks(run_dir: Path, revisions: dict[str, str]) -> list[tuple[str, bool, str]]:
    """(check, passed, what was found) for the finished run in `run_dir`; `revisions`: hub id -> pinned commit."""
    done = finished(run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    model = config["model"]["name_or_path"]
    pinned = revisions.get(model)
    attempts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines() if line.strip()]
    drill = config["checkpoint"].get("drill_at_steps")
    stopped = [a for a in attempts if a["exit_status"] == 75]
    requeued = stopped and attempts[-1]["exit_status"] == 0 and attempts[-1]["restart_count"] >= 1
    container, commit, norm = done.get("container"), done.get("model_commit"), done.get("lora_b_norm")
    return [
        ("image", bool(container), f"ran in {container}" if container else "ran outside an image"),
        (
            "staged model",
            bool(pinned) and commit == pinned and done.get("hub_offline") is True,
            f"{model} at commit {commit} (pinned: {pinned}), "
            + ("read offline" if done.get("hub_offline") else "HF_HUB_OFFLINE not set"),
        ),
        ("GPU", done.get("gpus", 0) >= 1, f"{done.get('gpus', 0)} x {done.get('gpu_name')}"),
        ("dtype", done.get("dtype") in ("bfloat16", "float16"), f"compute dtype {done.get('dtype')}"),
        (
            "LoRA trained",
            bool(norm),
            f"adapters' B matrices at norm {norm:.4g} (0 when untrained)" if norm is not None else "no LoRA adapters",
        ),
        (
            "checkpoint and requeue",
            bool(requeued),
            f"{len(attempts)} attempts, exit statuses {[a['exit_status'] for a in attempts]}, restarts "
            f"{[a['restart_count'] for a in attempts]} (the drill stops the first at step {drill}); finished at "
            f"{done.get('env_steps')} steps",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sacglam_core.pipeline.gpu_smoke", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--experiment", default="gpu_smoke")
    parser.add_argument("--profile", default="profiles/slurm", help="the profile the run was launched with")
    args = parser.parse_args(argv)
    try:
        settings = settings_of(args.profile, {})
        definitions = load_definitions(*settings.definition_files)
        runs = expand(definitions, [args.experiment], Path(settings.results), {"models": settings.models})
        failed = False
        for run in runs:
            if finished(run.directory) is None:
                print(f"error: {run.directory} has not finished: `python -m sacglam_core.pipeline.status "
                      f"--profile {args.profile} {args.experiment}` says where it is", file=sys.stderr)  # fmt: skip
                return 2
            print(f"{run.directory}:")
            for name, passed, found in checks(run.directory, settings.model_revisions):
                print(f"{'PASS' if passed else 'FAIL'}  {name}: {found}")
                failed |= not passed
    except (WorkflowConfigError, ExperimentError, RunStateError, OSError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
