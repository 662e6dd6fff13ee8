"""A first job's verdict: what a campaign depends on, checked from the files of the `gpu_smoke` run, one line each.

    .venv/bin/snakemake --profile profiles/slurm --config 'experiments=[gpu_smoke]'
    .venv/bin/python -m sacglam_core.jobs.gpu_smoke

The run (one seed of SAC-GLAM+HER, Flan-T5-base as the paper's experiments load it, a few hundred steps) stops once
halfway as at a time limit (`checkpoint.drill_at_steps`), is requeued and resumes. Checked, from its done.json,
config.yaml and attempts.jsonl, each for what its name says:

- image: the run ran in an image built from this repository's containers/sacglam.def and requirements.lock (their
  SHA-256, which the image carries); NOT RUN where no image is configured and the run ran outside one;
- staged model: the hub model at its pinned commit, loaded without a single network connection attempted;
- GPU: the run computed on a GPU;
- dtype: the compute dtype is what `model.dtype` gives on that GPU's compute capability (bf16 from sm_80, fp16
  below), the 4-bit layers were loaded as 4-bit and compute in it, the other weights are in it;
- LoRA trained: each optimizer's own steps moved the adapters it trains (Adam's first moment there is not 0), the
  actor's included (the adapters' norm cannot tell: a critic sharing them moves them alone);
- checkpoint and requeue: stopped by the drill, requeued, resumed at the drill's step with the weights it saved.

Exit status 0 when no check fails, 1 when one fails, 2 when the run is not there to check.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sacglam_core.config import ConfigError, RunConfig, load_config
from sacglam_core.jobs.status import campaign_settings
from sacglam_core.pipeline.config import WorkflowConfigError
from sacglam_core.pipeline.experiments import ExperimentError, expand, load_definitions
from sacglam_core.runfiles import IMAGE_FILES, RunStateError, file_sha256, finished

ROOT = Path(__file__).resolve().parents[2]
Check = tuple[str, bool | None, str]  # (check, passed or None where it could not run, what was found)


def repository_image() -> dict[str, str | None]:
    """The SHA-256 of this repository's image definition and lock, which a run in its image records."""
    return {kind: file_sha256(ROOT / "containers" / name) for kind, name in IMAGE_FILES.items()}


def checks(run_dir: Path, revisions: dict[str, str], container: str | None = None) -> list[Check]:
    """The checks of the finished run in `run_dir`; `revisions`: hub id -> pinned commit; `container`: the image the
    launcher runs jobs in (None: no image configured)."""
    done = finished(run_dir)
    config = load_config(run_dir / "config.yaml")
    attempts = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines() if line.strip()]
    return [
        _image(done, container),
        _staged_model(done, config, revisions),
        _gpu(done),
        _dtype(done, config),
        _lora(done),
        _requeue(done, config, attempts),
    ]


def _image(done: dict, container: str | None) -> Check:
    image = done.get("image")
    if image is None:
        if container:
            return "image", False, f"ran outside an image, though the launcher runs jobs in {container}"
        return "image", None, "ran outside an image (no launcher.container): not checked"
    expected = repository_image()
    found = {kind: image.get(f"{kind}_sha256") for kind in expected}
    if found == expected:
        return (
            "image",
            True,
            f"ran in {image.get('path')}, built from this repository's {' and '.join(IMAGE_FILES.values())}",
        )
    differ = ", ".join(
        f"{IMAGE_FILES[k]} {str(found[k])[:12]} (here {str(expected[k])[:12]})"
        for k in expected
        if found[k] != expected[k]
    )
    return "image", False, f"ran in {image.get('path')}, not built from this repository: {differ}"


def _staged_model(done: dict, config: RunConfig, revisions: dict[str, str]) -> Check:
    model, commit, network = config.model.name_or_path, done.get("model_commit"), done.get("model_network")
    pinned = revisions.get(model)
    read = (
        "connections not recorded"
        if network is None
        else "read offline: no connection attempted"
        if not network
        else f"{len(network)} connection attempts while loading ({network[0]})"
    )
    passed = bool(pinned) and commit == pinned and network == []
    return "staged model", passed, f"{model} at commit {commit} (pinned: {pinned}), {read}"


def _gpu(done: dict) -> Check:
    plan = done.get("device_plan") or {}
    on_gpu = done.get("gpus", 0) >= 1 and str(plan.get("device", "")).startswith("cuda")
    capability = plan.get("capability")
    where = f", sm_{capability[0]}{capability[1]}" if capability else ""
    return (
        "GPU",
        on_gpu,
        f"{done.get('gpus', 0)} x {done.get('gpu_name')}{where} ({plan.get('device', 'device not recorded')})",
    )


def _dtype(done: dict, config: RunConfig) -> Check:
    capability = (done.get("device_plan") or {}).get("capability")
    dtype, weights = done.get("dtype"), done.get("weights") or {}
    expected = config.model.compute_dtype(tuple(capability) if capability else None)
    problems = [] if dtype == expected else [f"computed in {dtype}"]
    if config.model.load_in_4bit:
        layers, computes = weights.get("4bit_layers", 0), weights.get("4bit_compute_dtypes")
        if not layers:
            problems.append("no 4-bit layer loaded (load_in_4bit: true)")
        elif computes != [expected]:
            problems.append(f"4-bit layers computing in {computes}")
    if weights.get("embedding_dtype") != expected:
        problems.append(f"embeddings in {weights.get('embedding_dtype')}")
    quantized = f"; {weights.get('4bit_layers', 0)} 4-bit layers ({', '.join(weights.get('quant_types', []))})"
    device = f"sm_{capability[0]}{capability[1]}" if capability else "a CPU"
    rule = f"model.dtype {config.model.dtype} on {device} is {expected}"
    found = f"{rule}: " + ("; ".join(problems) if problems else f"computed in {dtype}") + quantized
    return "dtype", not problems, found


def _lora(done: dict) -> Check:
    record = done.get("optimizers") or {}
    trained = {name: r for name, r in record.items() if r.get("lora_tensors")}
    first = next(iter(record), None)  # the actor's (or PPO's policy's)
    passed = first in trained and all(r["steps"] > 0 and r["lora_moment_norm"] > 0 for r in trained.values())
    found = "; ".join(
        f"{name}: {r['steps']} steps, Adam's first moment on its {r['lora_tensors']} adapter tensors "
        f"{r['lora_moment_norm']:.3g}"
        for name, r in record.items()
    )
    return "LoRA trained", passed, found or "no optimizer recorded"


def _requeue(done: dict, config: RunConfig, attempts: list[dict]) -> Check:
    drill = config.checkpoint.drill_at_steps
    stop = -(-drill // config.num_envs) * config.num_envs if drill else None  # the first step at or after the drill
    stopped = [a for a in attempts if a["exit_status"] == 75]
    last = attempts[-1] if attempts else {}
    # A SLURM job requeues itself (its restart count grows); a local launch starts a process anew.
    requeued = (
        bool(stopped)
        and last.get("exit_status") == 0
        and (last.get("restart_count", 0) >= 1 or str(last.get("job_id", "")).startswith("local-"))
    )
    resumes = done.get("resumes") or []
    matching = [
        r for r in resumes if r.get("saved") is not None and math.isclose(r["saved"], r["loaded"], rel_tol=1e-9)
    ]
    resumed = bool(resumes) and len(matching) == len(resumes) and resumes[0]["env_steps"] == stop
    finished_all = done.get("env_steps") == config.total_steps
    first = resumes[0] if resumes else None
    how = (
        f"resumed at step {first['env_steps']} (the drill's: {stop}), weights' checksum {first['loaded']:.9g} loaded, "
        f"{first['saved']} saved" if first and first.get("saved") is not None
        else f"resumed at step {first['env_steps']} from a checkpoint without a checksum" if first
        else "never resumed"
    )  # fmt: skip
    found = (
        f"{len(attempts)} attempts, exit statuses {[a['exit_status'] for a in attempts]}, restarts "
        f"{[a.get('restart_count') for a in attempts]}; {how}; finished at {done.get('env_steps')} of "
        f"{config.total_steps} steps"
    )
    return "checkpoint and requeue", requeued and resumed and finished_all, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.jobs.gpu_smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", default="gpu_smoke")
    parser.add_argument(
        "--profile", help="the profile the run was launched with (default: the last launch's, as `status` finds it)"
    )
    parser.add_argument("--results", help="the results folder (default: the profile's)")
    args = parser.parse_args(argv)
    try:
        settings = campaign_settings(args.profile, args.results, {"results": args.results} if args.results else {})
        definitions = load_definitions(*settings.definition_files)
        runs = expand(definitions, [args.experiment], Path(settings.results), {"models": settings.models})
        failed = False
        for run in runs:
            if finished(run.directory) is None:
                print(f"error: {run.directory} has not finished: `python -m sacglam_core.jobs.status "
                      f"--results {settings.results} {args.experiment}` says where it is", file=sys.stderr)  # fmt: skip
                return 2
            print(f"{run.directory}:")
            for name, passed, found in checks(run.directory, settings.model_revisions, settings.launcher.container):
                print(f"{VERDICT[passed]}  {name}: {found}")
                failed |= passed is False
    except (WorkflowConfigError, ExperimentError, ConfigError, RunStateError, OSError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 1 if failed else 0


VERDICT = {True: "PASS", False: "FAIL", None: "NOT RUN"}

if __name__ == "__main__":
    raise SystemExit(main())
