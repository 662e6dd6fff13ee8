"""The training loop of one run (see train.py for the command line).

Under torchrun (or submitit's distributed environment) every process runs its data-parallel ranks' share of the 32
environments with its own copy of the LLM and gradients are averaged (see distributed.py); a process that holds
several ranks (`ranks`) acts for all of them in one pass and updates on their batches together.

The run writes into `output_dir`: `config.yaml`, `metrics.csv` (one row per evaluation),
`checkpoints/` and, when finished, `done.json`. Started again on the same folder it resumes from the
newest good checkpoint and gives the same numbers as an uninterrupted run. When `stop` is set (by
SIGTERM, SIGUSR2 or SIGINT in train.py) it checkpoints at the next step and returns EXIT_PREEMPTED.

Rank 0 holds the run directory's lease (lease.py) from before it touches anything in it until the run
returns, so a second trainer on the same directory is refused at start.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sacglam_core import EXIT_DIVERGED, EXIT_PREEMPTED, planner_probe, rundir, runfiles
from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.lm import compile_seconds
from sacglam_core.algos.ppo import PPO
from sacglam_core.algos.sac import SAC
from sacglam_core.algos.stats import Diverged, across_processes, skipped_warning
from sacglam_core.atomic import atomic_write
from sacglam_core.checkpoint import FORMAT, Checkpointer, CheckpointError
from sacglam_core.config import ConfigError, ModelConfig, RunConfig, dump_config
from sacglam_core.counters import RunCounters
from sacglam_core.device_plan import DevicePlan
from sacglam_core.distributed import Ranks, init_ranks
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import evaluate_rounds, goal_type_prior
from sacglam_core.goal_sampling import GoalSampler
from sacglam_core.metrics import MetricsFile, evaluates_at
from sacglam_core.monitor import Monitor, setup_cost
from sacglam_core.provenance import run_record, weights_checksum
from sacglam_core.trajectories import EpisodeRecorder


@dataclass
class Shard:
    """One data-parallel rank's share of the run in this process: its environments, the goals they pursue, their
    open episodes and its action sampling, each seeded by the rank."""

    envs: VectorPlayground
    goals: GoalSampler | None
    recorder: EpisodeRecorder
    generator: torch.Generator

    @classmethod
    def of_rank(cls, config: RunConfig, rank: int, ranks: int, tokens) -> Shard:
        seed = config.seed * 1000 + rank
        envs = VectorPlayground(config.num_envs // ranks, config.env, seed=seed)
        goals = None if config.goals.sampler == "uniform" else GoalSampler(config.goals, config.env, seed + 2)
        envs.goal_source = goals.next_goal if goals else None
        return cls(envs, goals, EpisodeRecorder(tokens), torch.Generator().manual_seed(seed + 1))

    def step(self, algo, index: int, candidates: list, choices: list, extras: dict) -> tuple[int, int]:
        """Its environments' step with the chosen candidates; each finished episode goes to `algo` (as rank `index`'s)
        and to the goal sampler. The episodes finished and succeeded."""
        obs, rewards, terminated, truncated, infos = self.envs.step(
            [ACTION_VOCABULARY[c[k]] for c, k in zip(candidates, choices)]
        )
        finished = succeeded = 0
        for episode in self.recorder.step(choices, rewards, terminated, truncated, obs, infos, extras):
            algo.add(episode, index)
            if self.goals is not None:
                self.goals.observe(episode.goal, episode.terminated, episode.described)
            finished, succeeded = finished + 1, succeeded + int(episode.terminated)
        return finished, succeeded

    def state_dict(self) -> dict:
        return {
            "envs": self.envs.state_dict(),
            "recorder": self.recorder.state_dict(),
            "generator": self.generator.get_state(),
            "goals": None if self.goals is None else self.goals.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.envs.load_state_dict(state["envs"])
        self.recorder.load_state_dict(state["recorder"])
        self.generator.set_state(state["generator"])
        if self.goals is not None:
            self.goals.load_state_dict(state["goals"])


class Trainer:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.plan = DevicePlan.of_run(config)
        self.ranks = ranks = init_ranks(self.plan).holding(config.ranks)
        sac = config.algorithm == "sac"
        split = {"num_envs": config.num_envs, **({"sac.batch_size": config.sac.batch_size} if sac else {})}
        for key, value in split.items():
            if value % ranks.total:
                raise ConfigError(f"{key}={value} cannot be split evenly over {ranks.total} data-parallel ranks")
        self.out = Path(config.output_dir)
        self.lease = rundir.take(self.out, ranks)
        try:
            if config.threads:
                torch.set_num_threads(config.threads)
            self.threads = torch.get_num_threads()  # results depend on it: a resume must use the same
            self.checkpoints = Checkpointer(self.out / "checkpoints", config.checkpoint.keep, ranks)
            # Refusals come before the model loads (minutes for a large one).
            self.finished = rundir.finished(self.out, config.fingerprint)
            self._checkpoint = None if self.finished else self.checkpoints.load_run(config.fingerprint, self.threads)
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        config, ranks = self.config, self.ranks
        torch.set_flush_denormal(True)  # denormals make CPU backward passes several times slower
        torch.manual_seed(config.seed)  # the same initial heads on every rank
        self._compiled_before = compile_seconds()  # the process's own count: other trainers' compilations are not ours
        self.agent = GlamAgent.from_config(AgentConfig.of_run(config, self.plan), ACTION_VOCABULARY)
        self.model_sha256 = _weights_sha256(config.model)
        self.shards = [Shard.of_rank(config, rank, ranks.total, self.agent.tokens) for rank in ranks.held]
        # Each rank chooses its environments' goals from its own episodes; the metrics show the first rank's sampler.
        self.goals = self.shards[0].goals
        prior = goal_type_prior(config.env)
        self.algo = (
            SAC(self.agent, config, ranks, prior) if config.algorithm == "sac" else PPO(self.agent, config, ranks)
        )
        self.metrics = MetricsFile(self.out / "metrics.csv")
        probed = config.monitor.planner_probe
        self.probe = planner_probe.probe_states(config, probed) if probed and ranks.is_main else None
        self.action_tokens = [self.agent.tokens.action(a) for a in ACTION_VOCABULARY]
        self.counters = RunCounters(network=list(self.agent.source.network))
        self.window = [0, 0]  # training episodes finished and succeeded since the last metrics row
        self._saved_at = -1  # env steps of the last checkpoint this process wrote or resumed from
        self._skipped = (0.0, 0.0)  # float16: optimizer steps and steps its scaler skipped, at the last metrics row

    def close(self) -> None:
        """Give the run directory's lease back (the end of the process also does)."""
        self.lease.release()

    # -- the loop --------------------------------------------------------------------------------
    def run(self, stop_at_steps: int | None = None, stop: threading.Event | None = None) -> int:
        try:
            return self._run(stop_at_steps, stop)
        except Diverged as error:
            if self.ranks.is_main:
                rundir.record_divergence(self.out, str(error), self.counters.env_steps)
            return EXIT_DIVERGED
        finally:
            self.close()

    def _check_health(self) -> None:
        """Diverged if an update's loss or gradients' norm went non-finite (on any process)."""
        found = self.algo.divergence()
        if self.ranks.any(found is not None):
            what, index, step = found or ("non-finite on another process", -1, self.counters.env_steps)
            raise Diverged(f"training diverged at {self.algo.health.unit} {index + 1} (step {step:,}): {what}")

    def _check_finite(self) -> None:
        """Diverged unless every trained weight, optimizer state and alpha is finite: what a checkpoint would keep."""
        tensors = [v for v in self.agent.mutable_state_dict().values() if v.is_floating_point()]
        tensors += self.algo.trained_tensors()
        finite = bool(torch.stack([t.isfinite().all() for t in tensors]).all())
        if not self.ranks.all(finite):
            raise Diverged(
                f"training diverged by step {self.counters.env_steps:,}: a trained weight or optimizer state is not "
                "finite"
            )

    def _run(self, stop_at_steps: int | None, stop: threading.Event | None) -> int:
        if self.finished:
            print(f"{self.out}: already finished (done.json exists)", file=sys.stderr)
            return 0
        if self.ranks.any(stop is not None and stop.is_set()):
            print(f"{self.out}: stopped during start-up, before any step; nothing to checkpoint", file=sys.stderr)
            return EXIT_PREEMPTED
        starts = [shard.envs.reset() for shard in self.shards]
        if self.ranks.is_main:  # at every start: a resumed run's config.yaml is its own again, whatever befell it
            atomic_write(self.out / "config.yaml", dump_config(self.config).encode())
            print(f"{self.out}: {self.plan.line}", file=sys.stderr)
        resumed = self._resume()
        drill = self.config.checkpoint.drill_at_steps
        if resumed is None and drill is not None:  # the requeue drill: once, in an attempt that did not resume
            print(f"{self.out}: requeue drill: this attempt stops at {drill} steps", file=sys.stderr)
            stop_at_steps = min(drill, stop_at_steps or drill)
        self.gpus = _gpus_used(self.plan, self.ranks)
        count = self.counters
        self.monitor = Monitor(
            self.config, self.out, self.ranks, self.gpus, self.plan.summary, count.env_steps, count.elapsed, resumed
        )
        if resumed is None:
            for shard, (obs, infos) in zip(self.shards, starts):
                shard.recorder.reset(infos["goal"], obs, infos["possible_actions"])
            if self.ranks.is_main:
                self.metrics.restore([])
            self._log_row()  # the untrained agent's success rates at step 0
        first_step = count.env_steps
        started = time.perf_counter() - count.elapsed
        try:
            while count.env_steps < self.config.total_steps:
                if self._should_stop(stop_at_steps, stop):
                    return self._stop(new_steps=count.env_steps > first_step)
                self._step(started)
        finally:
            self.monitor.close()
        if self._saved_at != count.env_steps:
            self._save()
        self._write_done(self._check_in_sync())
        return 0

    def _write_done(self, checksums: list[float]) -> None:
        if not self.ranks.is_main:
            return
        count = self.counters
        kernels = torch.backends.cpu.get_cpu_capability()
        summary = runfiles.done_record(
            count.env_steps, count.elapsed, count.train_seconds, count.last_success,
            world=self.ranks.world, weight_checksums=checksums,
            **runfiles.hardware(self.gpus, self.plan.gpu, kernels), dtype=self.plan.dtype,
            **run_record(self.agent, self.algo.optimizers), model_sha256=self.model_sha256,
            model_network=count.network, resumes=count.resumes, threads=self.threads,
            capture_seconds=round(self.agent.graphs.seconds, 1), compile_seconds=round(self.compile_seconds(), 1),
            device_plan=self.plan.record(), fingerprint=self.config.fingerprint,
        )  # fmt: skip
        atomic_write(self.out / runfiles.DONE, json.dumps(summary, indent=1).encode())

    def _step(self, started: float) -> None:
        """One step of every environment, the update when due, then metrics, progress and checkpoint when due."""
        tick, count = time.perf_counter(), self.counters
        candidates = [c for shard in self.shards for c in shard.recorder.candidates()]
        batch = self.agent.lm.collate(  # every rank this process holds acts in one pass
            [p for shard in self.shards for p in shard.recorder.prompts()],
            [[self.action_tokens[a] for a in c] for c in candidates],
            [c.tolist() for c in candidates],
        )
        choices, extras = self.algo.act(batch, [shard.generator for shard in self.shards])
        width = len(candidates) // len(self.shards)
        done = [
            shard.step(self.algo, i, candidates[rows], choices[rows], {k: v[rows] for k, v in extras.items()})
            for i, shard in enumerate(self.shards)
            for rows in [slice(i * width, (i + 1) * width)]
        ]
        finished, succeeded = sum(d[0] for d in done), sum(d[1] for d in done)
        self.window = [self.window[0] + finished, self.window[1] + succeeded]
        self.monitor.episodes(finished, succeeded)
        count.env_steps += self.config.num_envs
        updates_before = self.algo.updates
        if self.algo.update_due(count.env_steps):
            self.algo.update([shard.recorder for shard in self.shards], count.env_steps)
        count.train_seconds += time.perf_counter() - tick
        count.elapsed = time.perf_counter() - started
        if self.monitor.scalars(count.env_steps, count.elapsed, self.algo):
            self._check_health()  # the statistics were just read: the losses' health comes with them
        if evaluates_at(self.config, count.env_steps):
            self._log_row()
        self.monitor.progress(
            count.env_steps, count.elapsed, lambda: setup_cost(self.agent.graphs, self.compile_seconds())
        )
        every = self.config.checkpoint.every_updates
        if self.algo.updates // every > updates_before // every:
            self._save()

    def compile_seconds(self) -> float:
        """Seconds this run has spent compiling (`model.compile`), not counting other runs in its process."""
        return compile_seconds() - self._compiled_before

    def _stop(self, new_steps: bool) -> int:
        """Checkpoint what this process added (if anything) and say "requeue me"."""
        steps = self.counters.env_steps
        if new_steps and self._saved_at != steps:
            self._save()
        said = (
            "checkpointed at {} steps; run again to resume"
            if new_steps
            else "stopped at {} steps, before any new step; nothing new to checkpoint"
        )
        print(f"{self.out}: {said.format(steps)}", file=sys.stderr)
        return EXIT_PREEMPTED

    def _should_stop(self, stop_at_steps: int | None, stop: threading.Event | None) -> bool:
        requested = stop is not None and stop.is_set()
        return self.ranks.any(requested or (stop_at_steps is not None and self.counters.env_steps >= stop_at_steps))

    # -- metrics ---------------------------------------------------------------------------------
    def _log_row(self) -> None:
        self._check_health()
        count = self.counters
        if self.plan.loss_scaling:
            share, self._skipped = self.algo.health.skipped_share(self._skipped)
            if share > 0.5 and self.ranks.is_main:
                print(f"warning: {self.out}: {skipped_warning(share)}", file=sys.stderr)
        rounds = self.config.eval.start_rounds if count.env_steps == 0 else 1
        metrics = evaluate_rounds(self.agent, self.config, self.ranks, count.eval_rounds, rounds)
        count.eval_rounds += rounds
        if self.probe is not None and self.ranks.is_main:
            metrics |= planner_probe.measure(
                self.agent, self.probe, self.algo.alpha if self.config.algorithm == "sac" else None
            )
        episodes, successes = self.ranks.sum([float(self.window[0]), float(self.window[1])])
        count.episodes += int(episodes)
        self.window = [0, 0]
        seconds, steps, updates = count.last_row
        span = max(count.elapsed - seconds, 1e-9)
        row = {
            "env_steps": count.env_steps,
            "wall_seconds": count.elapsed,
            "train_seconds": count.train_seconds,
            "episodes": count.episodes,
            "train_success": successes / episodes if episodes else float("nan"),
            **metrics,
            **across_processes(self.algo.pop_stats(), self.ranks),
            "updates_per_s": (self.algo.updates - updates) / span,
            "env_steps_per_s": (count.env_steps - steps) / span,
        }
        if self.goals is not None:
            goals = self.goals.statistics()
            row["goals_known"] = goals.pop("goals_known")
            row["goal_buckets"] = json.dumps(goals, sort_keys=True)
            self.monitor.goals({"known": row["goals_known"], **goals}, count.env_steps)
        count.last_row = (count.elapsed, count.env_steps, self.algo.updates)
        count.last_success = metrics["eval_success"]
        if self.ranks.is_main:
            self.metrics.append(row)
        self.monitor.evaluation(row)

    # -- checkpoint and resume -------------------------------------------------------------------
    def _check_in_sync(self) -> list[float]:
        """Every rank's checksum of the trained weights; they must agree (gradients are averaged)."""
        checksums = self.ranks.gather(weights_checksum(self.agent))
        if len(set(checksums)) > 1:
            raise RuntimeError(f"data-parallel ranks are out of sync: weight checksums {checksums}")
        return checksums

    def _save(self) -> None:
        self._check_health()
        self._check_finite()  # a checkpoint of non-finite state would be resumed from, and diverge again
        counters = self.counters.state_dict() | {
            "metrics_rows": self.metrics.rows,
            "weights_checksum": self._check_in_sync()[0],
        }
        shared = {
            "format": FORMAT,
            "fingerprint": self.config.fingerprint,
            "threads": self.threads,
            "agent": self.agent.mutable_state_dict(),
            "algo": self.algo.state_dict(),
            "counters": counters,
        }
        local = {
            "shards": [shard.state_dict() for shard in self.shards],
            "algo": self.algo.local_state_dict(),
            "torch_rng": torch.get_rng_state(),
            "window": list(self.window),
            "monitor": self.monitor.state_dict(),
        }
        self.checkpoints.save(self.counters.env_steps, shared, local)
        self._saved_at = self.counters.env_steps

    def _resume(self) -> dict | None:
        """Load the checkpoint found at start, if any: its monitor state for this rank, None without a checkpoint."""
        if self._checkpoint is None:
            return None
        (shared, local), self._checkpoint = self._checkpoint, None
        self.agent.load_mutable_state_dict(shared["agent"])
        self.algo.load_state_dict(shared["algo"])
        saved, network = shared["counters"], self.counters.network
        self.counters = count = RunCounters.from_state_dict(saved)
        # What this resume loaded against what was saved: the first job's check that a requeue resumes its run.
        count.resumes.append(
            {"env_steps": count.env_steps, "saved": saved["weights_checksum"], "loaded": weights_checksum(self.agent)}
        )
        count.network += network
        if len(local["shards"]) != len(self.shards):
            raise CheckpointError(
                f"the checkpoints in {self.checkpoints.directory} hold {len(local['shards'])} data-parallel ranks per "
                f"process, this run {len(self.shards)}: resume with the same ranks and processes"
            )
        for shard, state in zip(self.shards, local["shards"]):
            shard.load_state_dict(state)
        self.algo.load_local_state_dict(local["algo"])
        torch.set_rng_state(local["torch_rng"])
        self.window = list(local["window"])
        if self.ranks.is_main:
            self.metrics.restore(saved["metrics_rows"])
        self._saved_at = count.env_steps
        print(f"{self.out}: resumed at {count.env_steps} environment steps", file=sys.stderr)
        return local["monitor"]


def _gpus_used(plan: DevicePlan, ranks: Ranks) -> int:
    """The GPUs the run's processes compute on, each counted once (processes may share one); 0 on CPUs."""
    if plan.gpu is None:
        return 0
    return len(set(ranks.gather_strings(str(torch.cuda.get_device_properties(plan.device).uuid))))


def _weights_sha256(model: ModelConfig) -> str | None:
    """SHA-256 of a local model folder's single `model.safetensors` (None for a hub model, whose pinned revision says
    which it is, or sharded weights)."""
    return runfiles.file_sha256(Path(model.name_or_path).expanduser() / "model.safetensors")
