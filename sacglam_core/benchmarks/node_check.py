"""What a cluster job does first, checked on one GPU: several processes meeting between captured graphs, float16 as a
V100 computes, and the first job (gpu_smoke) run on a GPU. A CPU runs the same logic, for tests.

    python -m sacglam_core.benchmarks.node_check --out /tmp/node-check              # on a GPU
    python -m sacglam_core.benchmarks.node_check --device cpu --out /tmp/node-check  # the logic, on a CPU

- `processes`: SAC-GLAM+HER and PPO-GLAM as 2 processes on the one GPU over gloo with CUDA tensors (`backend: gloo`:
  NCCL refuses two ranks on one GPU; the multi-process path differs from a node's 4 GPUs over NCCL in the backend's
  name alone), captured and compiled, against the same 2 ranks held by one process, in float32 without TF32 (`--dtype`
  another): every metric of the metrics rows but DIAGNOSTICS, and the distance between the trained weights, within
  `TOLERANCE`; the seconds per update of each layout (the last metrics row's window, after the first captures and
  compilations); the device plan each printed. `--repeat` runs the one-process layout again and reports how far apart
  the two are: the device's own nondeterminism, against which a difference between the layouts reads.
- `float16`: SAC-GLAM+HER and PPO-GLAM in float16 with the loss scaler, captured and compiled, against eager float16:
  losses finite, metrics within `TOLERANCE`; then, captured and compiled, a forced overflow (benchmarks/faults.py)
  at one update: that update's step of the poisoned optimizer skipped and nothing else, the scale halved, and the run
  finishing with every loss finite.
- `first job`: gpu_smoke's run (workflow/config/experiments.yaml, its settings) of a Flan-T5-base-shaped model
  (`--model` another) staged in a Hugging Face cache as google/flan-t5-base at its pinned commit and read offline,
  stopped by its drill, then resumed from the checkpoint it wrote on the GPU; gpu_smoke's checks on it.

Each part's figures are appended to `<out>/node_check.jsonl` as it ends (a part that fails says why there), and each
check prints one line; exit status 1 when one fails. Every part runs the trainer as a cluster job does
(`python -m sacglam_core.train`, torchrun for 2 processes), its tiny models built here, the tiny T5 with LoRA in
float32 (no bitsandbytes needed but for the first job's 4-bit weights).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sacglam_core.benchmarks import add_threads_argument, pin_threads

ROOT = Path(__file__).resolve().parents[2]
# metrics: relative (an absolute floor of 1e-5 for metrics near 0), losses and every other metric but DIAGNOSTICS;
# weights: the distance between two runs' trained weights as a share of how far training moved them from the start.
# Sums in another order over tens of Adam updates, which scale near-zero gradients up, and other kernels on a GPU
TOLERANCE = {"metrics": 1e-2, "weights": 1e-2}
# Differences of nearly equal numbers, reported and not judged: the KL between successive policies (about 1e-6 nats
# in these runs) and the planner probe's gaps and shares over a few dozen states, whose relative error under another
# summation order has no bound (on an H200, float32: 13% on planner_q_gap with every loss within 1%)
DIAGNOSTICS = ("policy_kl", "approx_kl", "planner_")
TIMING = ("wall_seconds", "train_seconds", "updates_per_s", "env_steps_per_s")
TINY = {  # a short run of the tiny T5 with LoRA: several updates within 256 steps
    "num_envs": 8,
    "total_steps": 256,
    "threads": 1,
    "env": {"n_objects": 3, "simplified": True, "max_steps": 8},
    "eval": {"every_steps": 128, "episodes_per_type": 4, "test_episodes": 4},
    "checkpoint": {"every_updates": 10**6},
    "monitor": {"tensorboard": False},
}
VARIANTS = {
    "SAC-GLAM+HER": {
        "algorithm": "sac",
        "her": {"enabled": True},
        "sac": {"batch_size": 16, "update_every": 16, "warmup_cycles": 1, "critic": {"hidden_units": 32}},
    },
    "PPO-GLAM": {"algorithm": "ppo", "ppo": {"rollout_steps": 64, "epochs": 2, "minibatch_size": 32}},
}


def write_run(path: Path, settings: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(settings))
    return path


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def train(config: Path, processes: int = 1, env: dict | None = None) -> subprocess.CompletedProcess:
    """The trainer as a job runs it: one process, or `processes` under torchrun."""
    command = [sys.executable, "-m", "sacglam_core.train", "--config", str(config)]
    if processes > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port", str(port)]
        command = [sys.executable, *launcher, "-m", "sacglam_core.train", "--config", str(config)]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=ROOT)
    config.with_suffix(".stderr").write_text(result.stderr)  # beside the run: the evidence when a check fails
    return result


def rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def plan_line(stderr: str) -> str | None:
    return next((line.split(": ", 1)[1] for line in stderr.splitlines() if ": device plan: " in line), None)


def trained_weights(out: Path) -> dict:
    """A run's trained weights, from its newest checkpoint's shared file (every rank holds the same)."""
    import torch

    newest = max((out / "checkpoints").glob("ckpt-*.shared.pt"))
    return torch.load(newest, weights_only=True, map_location="cpu")["agent"]


def initial_weights(settings: dict, where: Path) -> dict:
    """The weights a run of `settings` starts from (seeded: every layout starts from them)."""
    from sacglam_core.config import parse_config
    from sacglam_core.trainer import Trainer

    trainer = Trainer(parse_config(settings | {"output_dir": str(where)}))
    return {name: value.detach().cpu().clone() for name, value in trainer.agent.mutable_state_dict().items()}


def weights_apart(a: Path, b: Path, start: dict) -> float:
    """||a - b|| / ||a - start|| over the trained weights: how much of what training did differs between two runs."""
    x, y = trained_weights(a), trained_weights(b)
    floating = [k for k, v in start.items() if v.is_floating_point()]
    apart = sum(float((x[k].double() - y[k].double()).square().sum()) for k in floating)
    moved = sum(float((x[k].double() - start[k].double()).square().sum()) for k in floating)
    return math.sqrt(apart / moved) if moved > 0 else math.inf


def differences(a: Path, b: Path, start: dict) -> dict:
    """The largest relative difference of two runs' judged metrics (timings and DIAGNOSTICS aside), the diagnostics'
    largest, and how far apart their trained weights are (`weights_apart`)."""
    first, second = rows(a), rows(b)
    if [r["env_steps"] for r in first] != [r["env_steps"] for r in second]:
        return {"metrics": math.inf, "column": "env_steps", "weights": math.inf, "largest": {}, "diagnostics": {}}
    by_column: dict[str, float] = {}
    for x_row, y_row in zip(first, second):
        for key in x_row.keys() - set(TIMING):
            try:
                x, y = float(x_row[key] or "nan"), float(y_row[key] or "nan")
            except ValueError:  # a JSON column (the goal sampler's)
                continue
            if math.isnan(x) and math.isnan(y):
                continue
            gap = abs(x - y) / max(abs(x), abs(y), 1e-5) if not (math.isnan(x) or math.isnan(y)) else math.inf
            by_column[key] = max(by_column.get(key, 0.0), gap)
    ranked = sorted(by_column.items(), key=lambda item: -item[1])
    judged = [(key, gap) for key, gap in ranked if not key.startswith(DIAGNOSTICS)]
    worst, column = judged[0][1] if judged else 0.0, judged[0][0] if judged else None
    return {
        "metrics": worst,
        "column": column,
        "weights": weights_apart(a, b, start),
        "largest": dict(judged[:6]),
        "diagnostics": {key: gap for key, gap in ranked if key.startswith(DIAGNOSTICS)},
    }


def seconds_per_update(out: Path) -> float:
    last = rows(out)[-1]
    rate = float(last["updates_per_s"] or "nan")
    return 1 / rate if rate > 0 else math.nan


def processes_part(
    work: Path, model: Path, device: str, variants: list[str], dtype: str = "float32", repeat: bool = False
) -> tuple[dict, list[str]]:
    figures, failed = {}, []
    for variant in variants:
        settings = VARIANTS[variant]
        # float32 without TF32 on a GPU: TF32's 10-bit products round differently at each layout's batch shapes
        tf32 = dtype != "float32"
        lm = {"name_or_path": str(model), "device": device, "dtype": dtype, "lora": {"r": 4}, "tf32": tf32}
        base = merged(TINY, settings) | {"model": lm}
        together = write_run(
            work / variant / "one.yaml", base | {"ranks": 2, "output_dir": str(work / variant / "one")}
        )
        apart = write_run(
            work / variant / "two.yaml", base | {"backend": "gloo", "output_dir": str(work / variant / "two")}
        )
        one, two = train(together), train(apart, processes=2)
        if one.returncode or two.returncode:
            failed.append(f"{variant}: a layout failed: {(one.stderr if one.returncode else two.stderr)[-2000:]}")
            continue
        start = initial_weights(base, work / variant / "start")
        gap = differences(work / variant / "one", work / variant / "two", start)
        figures[variant] = {
            "2 ranks in one process": {
                "plan": plan_line(one.stderr),
                "s_per_update": seconds_per_update(work / variant / "one"),
            },
            "2 processes": {"plan": plan_line(two.stderr), "s_per_update": seconds_per_update(work / variant / "two")},
            "largest relative difference": gap,
        }
        if repeat:  # the same layout again: what the device's own nondeterminism puts between two runs, reported
            again = work / variant / "again"
            rerun = train(write_run(again.with_suffix(".yaml"), base | {"ranks": 2, "output_dir": str(again)}))
            same = differences(work / variant / "one", again, start) if rerun.returncode == 0 else rerun.stderr[-2000:]
            figures[variant]["one process, again"] = same
        if gap["metrics"] > TOLERANCE["metrics"] or gap["weights"] > TOLERANCE["weights"]:
            failed.append(f"{variant}: 2 processes differ from 2 ranks in one process: {gap} (tolerance {TOLERANCE})")
    return figures, failed


def float16_part(work: Path, model: Path, device: str, variants: list[str]) -> tuple[dict, list[str]]:
    figures, failed = {}, []
    fp16 = {"name_or_path": str(model), "device": device, "dtype": "float16", "lora": {"r": 4}}
    for variant in variants:
        base = merged(TINY, VARIANTS[variant])
        runs = {}
        for mode, how in (("captured and compiled", {}), ("eager", {"capture": False, "compile": False})):
            out = work / variant / mode.replace(" ", "-")
            result = train(write_run(out.with_suffix(".yaml"), base | {"model": fp16 | how, "output_dir": str(out)}))
            runs[mode] = (out, result)
        if any(result.returncode for _, result in runs.values()):
            failed.append(f"{variant}: a float16 run failed: " + "; ".join(r.stderr[-1500:] for _, r in runs.values()))
            continue
        start = initial_weights(merged(base, {"model": fp16}), work / variant / "start")
        gap = differences(runs["captured and compiled"][0], runs["eager"][0], start)
        losses = [
            k for k in ("critic_loss", "actor_loss", "policy_loss", "value_loss") if k in rows(runs["eager"][0])[-1]
        ]
        finite = all(
            math.isfinite(float(r[k])) for out, _ in runs.values() for r in rows(out)[1:] for k in losses if r[k]
        )
        overflow = forced_overflow(merged(base, {"model": fp16}) | {"output_dir": str(work / variant / "overflow")})
        figures[variant] = {
            "plan": plan_line(runs["captured and compiled"][1].stderr),
            "largest relative difference, captured and compiled against eager": gap,
            "losses finite": finite,
            "forced overflow": overflow,
        }
        if not finite:
            failed.append(f"{variant}: a float16 loss went non-finite")
        if gap["metrics"] > TOLERANCE["metrics"] or gap["weights"] > TOLERANCE["weights"]:
            failed.append(f"{variant}: captured and compiled float16 differs from eager: {gap} (tolerance {TOLERANCE})")
        if not overflow.get("passed"):
            failed.append(f"{variant}: the forced overflow: {overflow}")
    return figures, failed


def forced_overflow(settings: dict, at: int = 8) -> dict:
    """A float16 run in this process with the last optimizer's gradients (SAC's critic, PPO's) poisoned at its `at`-th
    update (a minibatch step for PPO), a replay of its captured graph: what the scaler did with it (that step skipped,
    the weights only it trains unchanged, the scale halved), and whether the run finished."""
    import torch

    from sacglam_core.benchmarks.faults import ForcedOverflow
    from sacglam_core.config import parse_config
    from sacglam_core.trainer import Trainer

    trainer = Trainer(parse_config(settings))
    algo = trainer.algo
    name, optimizer = list(algo.optimizers.items())[-1]
    scaler = algo.scalers[optimizer] if hasattr(algo, "scalers") else algo.scaler
    fault = ForcedOverflow(optimizer, trainer.agent.lm.device)
    seen: dict = {}
    update = "_update" if hasattr(algo, "_update") else "_minibatch_step"
    original, calls = getattr(algo, update), [0]
    others = [p for n, o in algo.optimizers.items() if n != name for g in o.param_groups for p in g["params"]]
    own = [p for g in optimizer.param_groups for p in g["params"] if all(p is not q for q in others)]

    graphs = trainer.agent.graphs

    def steps() -> list[float]:  # the poisoned optimizer's own step counts (a skipped step leaves them)
        return [float(s["step"]) for s in optimizer.state.values() if "step" in s]

    def poisoned(*args, **kwargs):
        calls[0] += 1
        if calls[0] != at:
            return original(*args, **kwargs)
        before, counted, captured = [p.detach().clone() for p in own], steps(), graphs.captured
        seen.update(scale=scaler.get_scale(), skipped=float(algo.health.skipped))
        fault.arm()
        try:
            return original(*args, **kwargs)
        finally:
            fault.disarm()
            seen.update(
                scale_after=scaler.get_scale(),
                skipped_after=float(algo.health.skipped),
                own_steps_unchanged=steps() == counted,
                weights_unchanged=all(torch.equal(a, p) for a, p in zip(before, own)),
                replayed=graphs.enabled and graphs.captured == captured,  # no capture in this call: a replay
            )

    setattr(algo, update, poisoned)
    with fault.installed():
        status = trainer.run()
    passed = (  # another optimizer may overflow on its own in float16: only the poisoned one's step is judged
        status == 0
        and bool(own)
        and bool(seen)
        and seen["skipped_after"] >= seen["skipped"] + 1
        and seen["scale_after"] == seen["scale"] / 2
        and seen["own_steps_unchanged"]
        and seen["weights_unchanged"]
        and (seen["replayed"] or not graphs.enabled)
    )
    skipped = float(algo.health.skipped)  # in the whole run: float16 overflows on its own too, early on
    return {"optimizer": name, "at_update": at, **seen, "skipped_in_run": skipped, "exit": status, "passed": passed}


def first_job_part(work: Path, model: Path | None, device: str) -> tuple[dict, list[str]]:
    import dataclasses

    from sacglam_core.config import dump_config
    from sacglam_core.jobs import gpu_smoke
    from sacglam_core.jobs.launch import record_attempt
    from sacglam_core.models.hub import stage_folder
    from sacglam_core.models.shapes import save_flan_t5_base_shaped
    from sacglam_core.pipeline.config import load_workflow_config
    from sacglam_core.pipeline.experiments import expand, load_definitions

    settings = load_workflow_config([str(ROOT / "workflow" / "config" / "config.yaml")], {})
    (run,) = expand(load_definitions(*settings.definition_files), ["gpu_smoke"], work / "results", {"models": "."})
    hub_id = run.config.model.name_or_path
    pinned = settings.model_revisions[hub_id]
    folder = model or save_flan_t5_base_shaped(work / "flan-t5-base-shaped")
    stage_folder(folder, hub_id, work / "hf-cache", pinned)
    model_config = dataclasses.replace(run.config.model, cache_dir=str(work / "hf-cache"), device=device)
    config_file = work / "gpu_smoke.yaml"
    config_file.write_text(
        dump_config(dataclasses.replace(run.config, model=model_config, output_dir=str(run.directory)))
    )
    attempts = []
    for expected in (75, 0):  # the drill stops the first attempt; the second resumes from its checkpoint
        started = time.perf_counter()
        result = train(config_file, env={"HF_HUB_OFFLINE": "1"})
        record_attempt(run.directory, f"local-{os.getpid()}", 1, result.returncode)
        attempts.append({"exit": result.returncode, "seconds": round(time.perf_counter() - started, 1)})
        if result.returncode != expected:
            why = f"attempt {len(attempts)} exited {result.returncode}, not {expected}: {result.stderr[-2000:]}"
            return {"attempts": attempts}, [f"first job: {why}"]
    checks = gpu_smoke.checks(run.directory, {hub_id: pinned}, container=None)
    lines = [f"{gpu_smoke.VERDICT[passed]}  {name}: {found}" for name, passed, found in checks]
    failed = [f"first job: {line}" for line, (_, passed, _) in zip(lines, checks) if passed is False]
    return {"attempts": attempts, "plan": plan_line(result.stderr), "gpu_smoke": lines}, failed


PARTS = {"processes": processes_part, "float16": float16_part, "first job": first_job_part}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where node_check.jsonl goes")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the logic alone")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--model", type=Path, help="the first job's model folder (default: Flan-T5-base's shape)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "auto"],
        help="the processes part's compute dtype (float32: a difference is the layout's, not a rounding's)",
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"processes and float16: of {', '.join(VARIANTS)}"
    )
    parser.add_argument(
        "--repeat",
        action="store_true",
        help="processes: run the one-process layout twice and report how far apart the two runs are (the device's "
        "own nondeterminism, against which the layouts' difference reads)",
    )
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    variants = args.variants.split(",")
    if unknown := [p for p in parts if p not in PARTS] + [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown parts or variants: {unknown}")
    pin_threads(args.threads)
    from sacglam_core.tiny.build import TINY_T5, build_tiny

    args.out.mkdir(parents=True, exist_ok=True)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny(Path(tmp) / "models")[TINY_T5]
        for part in parts:
            started = time.perf_counter()
            try:
                if part == "first job":
                    figures, failed = first_job_part(Path(tmp) / "first-job", args.model, args.device)
                else:
                    kept = args.out / "runs" / part  # each run's metrics, done.json and stderr stay for reading
                    if part == "processes":
                        figures, failed = processes_part(kept, tiny, args.device, variants, args.dtype, args.repeat)
                    else:
                        figures, failed = float16_part(kept, tiny, args.device, variants)
            except Exception as error:  # noqa: BLE001 (a part that breaks is a finding; the next still runs)
                figures, failed = {}, [f"{part}: {type(error).__name__}: {error}"]
            record = {"part": part, "device": args.device, "seconds": round(time.perf_counter() - started, 1)}
            with (args.out / "node_check.jsonl").open("a") as f:
                f.write(json.dumps(record | {"figures": figures, "failed": failed}, default=str) + "\n")
            print(f"{'FAIL' if failed else 'PASS'}  {part} ({record['seconds']} s): {json.dumps(figures, default=str)}")
            for line in failed:
                print(f"  {line}")
            failures += failed
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
