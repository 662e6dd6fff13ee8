"""What a run shows while it trains, on rank 0: a progress line every few steps on stderr (`trainer.log`, the SLURM
job's output), `progress.json` for `python -m sacglam_core.jobs.status`, TensorBoard event files and, when
asked, Weights & Biases (offline on compute nodes without internet).

Nothing here draws a random number or touches the model: a run gives the same metrics with and without it.
TensorBoard's scalars, with the environment step as their step:
- `train/...` every `monitor.scalars_every_steps`: the means since the last point of the algorithm's statistics
  (SAC: critic_loss, actor_loss, entropy, target_policy_entropy, mean_q, q_range, and alpha; PPO: policy_loss,
  value_loss, entropy, approx_kl, clipfrac, kl; both: policy_kl), `her_share` with HER, `success` of the training
  episodes finished since the last point, `env_steps_per_s` and `updates`;
- `eval/...` at each evaluation: the columns of metrics.csv that start with `eval_`;
- `goals/...` at each evaluation, with a goal sampler other than `uniform`: the goals known, and per bucket the share
  of the goals drawn since the last evaluation (`share/<bucket>`) and its learning progress (`lp/<bucket>`).

A run killed and started again shows in TensorBoard what an uninterrupted run shows, but for env_steps_per_s:
checkpoints carry the monitor's state, a resumed run hides the points the killed process wrote after the checkpoint
(it writes them again) and a fresh start removes the event files of killed earlier ones (metrics.csv starts afresh
too). W&B ignores a step at or below the last one it logged, so after a restart it keeps the killed process's points
up to the step where it was killed and the new process's beyond it. Runs being deterministic, those are the points
the new process would have logged again, but for env_steps_per_s and for a point the killed process had not logged
yet at that step (an evaluation after that step's training scalars).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from sacglam_core.atomic import atomic_write
from sacglam_core.config import RunConfig
from sacglam_core.runfiles import PROGRESS


def setup_cost(graphs, compiled: float) -> str:
    """What capturing `graphs` and compiling blocks (`compiled` seconds) have cost a run, for the progress line (""
    where neither runs): the first calls of each shape are slower, and this says by how much."""
    if not (graphs.enabled or compiled):
        return ""
    return f", {graphs.captured} graphs captured, capture+compile {duration(graphs.seconds + compiled)}"


def duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


class Monitor:
    """Rank 0's view of the run; every rank calls it (the training success is summed over ranks)."""

    def __init__(
        self,
        config: RunConfig,
        out: Path,
        ranks,
        gpus: int,
        plan: str,
        start_steps: int,
        start_elapsed: float,
        resumed: dict | None,
    ) -> None:
        """`resumed`: this rank's `state_dict` in the checkpoint the run resumed from ({} in one of format 2 that
        lacks it), None on a fresh start; `plan`: the device plan's summary, which progress.json carries."""
        settings = config.monitor
        self.config, self.out, self.ranks, self.gpus, self.plan = config, out, ranks, gpus, plan
        self.name = f"{out.parent.name}/{out.name}"
        self.progress_every = settings.progress_every_steps or max(config.total_steps // 50, 1)
        self.scalars_every = settings.scalars_every_steps or max(config.total_steps // 200, 1)
        self.writers: list = []
        if ranks.is_main and settings.tensorboard:
            self.writers.append(tensorboard_writer(out / "tensorboard", None if resumed is None else start_steps))
        self.wandb = None
        if ranks.is_main and settings.wandb != "off":
            self.wandb = start_wandb(config, out)
        self.start = (time.monotonic(), start_steps)  # for the ETA: this process's own pace
        self.last_line = self.last_scalars = (start_elapsed, start_steps)
        self.window = [0, 0]  # training episodes finished and succeeded since the last scalars, this rank
        self.line_window = [0, 0]  # the same since the last progress line
        self.last_eval: tuple[int, float] | None = None
        if resumed:
            self.load_state_dict(resumed)

    def episodes(self, finished: int, succeeded: int) -> None:
        self.window[0] += finished
        self.window[1] += succeeded
        self.line_window[0] += finished
        self.line_window[1] += succeeded

    def scalars(self, env_steps: int, elapsed: float, algo) -> bool:
        """After each environment step's update (all ranks): the training scalars when due; whether they were."""
        if env_steps // self.scalars_every <= self.last_scalars[1] // self.scalars_every:
            return False
        finished, succeeded = self.ranks.sum([float(n) for n in self.window])
        stats = algo.recent_stats()
        if not self.config.her.enabled:
            stats.pop("her_share", None)  # 0 without HER; metrics.csv keeps its column
        stats["env_steps_per_s"] = (env_steps - self.last_scalars[1]) / max(elapsed - self.last_scalars[0], 1e-9)
        stats["success"] = succeeded / finished if finished else float("nan")
        self._write("train", stats, env_steps)
        self.window = [0, 0]
        self.last_scalars = (elapsed, env_steps)
        return True

    def progress(self, env_steps: int, elapsed: float, setup: Callable[[], str] = str) -> None:
        """After each environment step and its evaluation (all ranks): the progress line when due; `setup()` says
        what capturing and compiling have cost so far (where they run), asked only for a line."""
        due = env_steps // self.progress_every > self.last_line[1] // self.progress_every
        if not (due or env_steps >= self.config.total_steps):
            return
        counts = self.ranks.sum([float(n) for n in self.line_window])
        self._progress(env_steps, elapsed, counts, setup())
        self.line_window = [0, 0]
        self.last_line = (elapsed, env_steps)

    def evaluation(self, row: dict) -> None:
        """One metrics row: its evaluation columns as `eval/...` (the planner probe's too)."""
        self.last_eval = (row["env_steps"], row["eval_success"])
        values = {
            key.removeprefix("eval_"): value for key, value in row.items() if key.startswith(("eval_", "planner_"))
        }
        self._write("eval", values, row["env_steps"])

    def goals(self, values: dict[str, float], step: int) -> None:
        """The goal sampler's statistics at a metrics row, as `goals/...` (bucket names with `_` for spaces)."""
        self._write("goals", {key.replace(" ", "_"): value for key, value in values.items()}, step)

    def state_dict(self) -> dict:
        """What a resumed run needs to show what an uninterrupted one would: the windows and the last points."""
        return {
            "window": list(self.window),
            "line_window": list(self.line_window),
            "last_scalars": list(self.last_scalars),
            "last_line": list(self.last_line),
            "last_eval": None if self.last_eval is None else list(self.last_eval),
        }

    def load_state_dict(self, state: dict) -> None:
        self.window, self.line_window = list(state["window"]), list(state["line_window"])
        self.last_scalars, self.last_line = tuple(state["last_scalars"]), tuple(state["last_line"])
        self.last_eval = None if state["last_eval"] is None else tuple(state["last_eval"])

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.wandb is not None:
            self.wandb.finish()

    def _write(self, group: str, values: dict[str, float], step: int) -> None:
        if not self.ranks.is_main:
            return
        values = {k: float(v) for k, v in values.items() if v == v}  # NaN: nothing to show yet
        for writer in self.writers:
            for key, value in values.items():
                writer.add_scalar(f"{group}/{key}", value, step)
            writer.flush()
        if self.wandb is not None:
            self.wandb.log({f"{group}/{key}": value for key, value in values.items()}, step=step)

    def _progress(self, env_steps: int, elapsed: float, counts: list[float], setup: str) -> None:
        if not self.ranks.is_main:
            return
        total = self.config.total_steps
        rate = (env_steps - self.last_line[1]) / max(elapsed - self.last_line[0], 1e-9)
        started, start_steps = self.start
        overall = (env_steps - start_steps) / max(time.monotonic() - started, 1e-9)
        eta = (total - env_steps) / overall if overall > 0 else float("inf")
        success = counts[1] / counts[0] if counts[0] else float("nan")
        episodes = f"training success {success:.3f} over {counts[0]:.0f} episodes" if counts[0] else "no episode ended"
        evaluation = f", evaluation {self.last_eval[1]:.3f} at {self.last_eval[0]:,}" if self.last_eval else ""
        print(
            f"{datetime.now():%Y-%m-%d %H:%M:%S} {self.name}: {env_steps:,}/{total:,} steps "
            f"({100 * env_steps / total:.0f}%), {rate:.2f} steps/s, {episodes}{evaluation}{setup}, "
            f"ETA {duration(eta) if env_steps < total else 'done'}",
            file=sys.stderr,
            flush=True,
        )
        record = {
            "env_steps": env_steps, "total_steps": total, "steps_per_s": rate, "train_success": success,
            "eval_success": self.last_eval[1] if self.last_eval else None,
            "eta_s": eta if eta != float("inf") else None,
            "wall_seconds": elapsed, "gpus": self.gpus, "time": time.time(), "host": socket.gethostname(),
            "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "world": self.ranks.world,
            "device_plan": self.plan,
        }  # fmt: skip
        atomic_write(self.out / PROGRESS, json.dumps(record, indent=1).encode())


def tensorboard_writer(folder: Path, resumed_at: int | None):
    """A writer into `folder` that hides what killed processes wrote: past the checkpoint a run resumed from (at step
    `resumed_at`), or everything on a fresh start."""
    from torch.utils.tensorboard import SummaryWriter

    if resumed_at is None:
        for path in folder.glob("events.out.tfevents.*"):
            path.unlink()
        return SummaryWriter(str(folder))
    # purge_step hides steps >= it, and the points at the checkpoint's step came before the checkpoint; steps advance
    # by num_envs, so nothing the resumed run writes is below resumed_at + 1
    return SummaryWriter(str(folder), purge_step=resumed_at + 1)


def start_wandb(config: RunConfig, out: Path):
    """A W&B run for `out`, resumed under the same id when the run resumes."""
    from dataclasses import asdict

    import wandb

    return wandb.init(
        project=config.monitor.wandb_project,
        name=f"{out.parent.parent.name}/{out.parent.name}/{out.name}",
        id=hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16],
        resume="allow",
        dir=str(out),
        mode=config.monitor.wandb,
        config=asdict(config),
    )
