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

import numpy as np
import torch

from sacglam_core import EXIT_DIVERGED, EXIT_PREEMPTED, planner_probe, runfiles
from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.agent.lm import compile_seconds
from sacglam_core.algos.ppo import PPO
from sacglam_core.algos.sac import SAC
from sacglam_core.algos.stats import MAXIMA, Diverged
from sacglam_core.atomic import atomic_write, check_writable, remove_stale_temporaries
from sacglam_core.checkpoint import Checkpointer, CheckpointError
from sacglam_core.config import ConfigError, ModelConfig, RunConfig, dump_config
from sacglam_core.cpu import cpu_name
from sacglam_core.device_plan import DevicePlan
from sacglam_core.distributed import init_ranks
from sacglam_core.envs import VectorPlayground
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import agent_policy, evaluate, goal_type_prior
from sacglam_core.goal_sampling import GoalSampler
from sacglam_core.lease import LeaseHeldError, RunLease
from sacglam_core.metrics import MetricsFile, evaluates_at
from sacglam_core.models.hub import hub_offline
from sacglam_core.models.loading import adapter_norm, lora_target_modules
from sacglam_core.monitor import Monitor, duration
from sacglam_core.provenance import image_identity, optimizer_record, weights_record
from sacglam_core.trajectories import EpisodeRecorder

# What a checkpoint holds; 1 was before checkpoints carried the metrics rows and the thread count.
CHECKPOINT_FORMAT = 2


class RunDirectoryError(RuntimeError):
    """An output_dir this run cannot use: not writable, or holding a finished run of another configuration."""


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
        self.lease = RunLease(self.out)
        self._take_lease()
        try:
            if config.threads:
                torch.set_num_threads(config.threads)
            self.threads = torch.get_num_threads()  # results depend on it: a resume must use the same
            self.checkpoints = Checkpointer(self.out / "checkpoints", config.checkpoint.keep, ranks)
            # Refusals come before the model loads (minutes for a large one).
            self.finished = self._finished()
            self._checkpoint = None if self.finished else self._load_checkpoint()
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        config, ranks = self.config, self.ranks
        torch.set_flush_denormal(True)  # denormals make CPU backward passes several times slower
        torch.manual_seed(config.seed)  # the same initial heads on every rank
        sac = config.algorithm == "sac"
        self._compiled_before = compile_seconds()  # the process's own count: other trainers' compilations are not ours
        self.agent = GlamAgent.from_config(AgentConfig.of_run(config, self.plan), ACTION_VOCABULARY)
        self.model_sha256 = _weights_sha256(config.model)
        self.shards = [Shard.of_rank(config, rank, ranks.total, self.agent.tokens) for rank in ranks.held]
        # Each rank chooses its environments' goals from its own episodes; the metrics show the first rank's sampler.
        self.goals = self.shards[0].goals
        self.algo = (
            SAC(self.agent, config, ranks, goal_type_prior(config.env)) if sac else PPO(self.agent, config, ranks)
        )
        self.metrics = MetricsFile(self.out / "metrics.csv")
        probed = config.monitor.planner_probe
        self.probe = planner_probe.probe_states(config, probed) if probed and ranks.is_main else None
        self.action_tokens = [self.agent.tokens.action(a) for a in ACTION_VOCABULARY]
        self.env_steps = self.episodes = self.eval_rounds = 0
        self.window = [0, 0]  # training episodes finished and succeeded since the last metrics row
        self.elapsed = 0.0
        self.train_seconds = 0.0  # time spent acting and updating (the loop without evaluations and checkpoints)
        self.last_row = (0.0, 0, 0)  # wall seconds, env steps, updates at the last metrics row
        self._last_success = float("nan")
        self._saved_at = -1  # env steps of the last checkpoint this process wrote or resumed from
        self._skipped = (0.0, 0.0)  # float16: optimizer steps and steps its scaler skipped, at the last metrics row
        self.resumes: list[dict] = []  # each resume's step and weights' checksum, saved and loaded
        self.network = list(self.agent.source.network)  # connections loading the model started, in every attempt

    def _take_lease(self) -> None:
        """Rank 0 takes the run directory's lease before anything in it is touched, then removes the
        temporary files of killed writes; every rank learns whether that worked."""
        error: Exception | None = None
        if self.ranks.is_main:
            try:
                self.lease.acquire()
                for directory in (self.out, self.out / "checkpoints"):
                    if directory.is_dir():  # refused now, not at the first checkpoint
                        check_writable(directory)
                    for path in remove_stale_temporaries(directory):
                        print(f"{self.out}: removed {path.name}, left by a killed write", file=sys.stderr)
            except LeaseHeldError as held:
                error = held
            except OSError as unwritable:
                error = RunDirectoryError(f"cannot write to output_dir {self.out}: {unwritable}")
        problem = self.ranks.gather_strings(str(error or ""))[0]
        if error is not None:
            self.close()
            raise error
        if problem:
            raise RunDirectoryError(f"rank 0 could not take the run directory: {problem}")

    def close(self) -> None:
        """Give the run directory's lease back (the end of the process also does)."""
        self.lease.release()

    # -- the loop --------------------------------------------------------------------------------
    def run(self, stop_at_steps: int | None = None, stop: threading.Event | None = None) -> int:
        try:
            return self._run(stop_at_steps, stop)
        except Diverged as error:
            return self._diverged(error)
        finally:
            self.close()

    def _check_health(self) -> None:
        """Diverged if an update's loss or gradients' norm went non-finite (on any process)."""
        found = self.algo.divergence()
        if self.ranks.any(found is not None):
            what, index, step = found or ("non-finite on another process", -1, self.env_steps)
            raise Diverged(f"training diverged at {self.algo.health.unit} {index + 1} (step {step:,}): {what}")

    def _check_finite(self) -> None:
        """Diverged unless every trained weight, optimizer state and alpha is finite: what a checkpoint would keep."""
        tensors = [v for v in self.agent.mutable_state_dict().values() if v.is_floating_point()]
        tensors += self.algo.trained_tensors()
        finite = bool(torch.stack([t.isfinite().all() for t in tensors]).all())
        if not self.ranks.all(finite):
            raise Diverged(
                f"training diverged by step {self.env_steps:,}: a trained weight or optimizer state is not finite"
            )

    def _diverged(self, error: Diverged) -> int:
        """Say where training diverged and which checkpoint is the last finite one (none was written after it), in
        one line and in diverged.json; a relaunch would resume from it and diverge again."""
        latest = runfiles.progress(self.out)
        last = f"last finite checkpoint at step {latest.steps:,}" if latest else "no checkpoint was written"
        message = f"{error}; {last}"
        if self.ranks.is_main:
            record = {"message": message, "env_steps": self.env_steps, "checkpoint": latest.steps if latest else None}
            atomic_write(self.out / runfiles.DIVERGED, json.dumps(record, indent=1).encode())
            print(f"error: {self.out}: {message}", file=sys.stderr)
        return EXIT_DIVERGED

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
        if self.ranks.is_main:
            print(f"{self.out}: {self.plan.line}", file=sys.stderr)
        resumed = self._resume()
        drill = self.config.checkpoint.drill_at_steps
        if resumed is None and drill is not None:  # the requeue drill: once, in an attempt that did not resume
            print(f"{self.out}: requeue drill: this attempt stops at {drill} steps", file=sys.stderr)
            stop_at_steps = min(drill, stop_at_steps or drill)
        self.gpus = gpus = self._gpus()
        self.monitor = Monitor(
            self.config, self.out, self.ranks, gpus, self.plan.summary, self.env_steps, self.elapsed, resumed
        )
        if resumed is None:
            for shard, (obs, infos) in zip(self.shards, starts):
                shard.recorder.reset(infos["goal"], obs, infos["possible_actions"])
            if self.ranks.is_main:
                self.metrics.restore([])
            self._log_row()  # the untrained agent's success rates at step 0
        first_step = self.env_steps
        started = time.perf_counter() - self.elapsed
        total = self.config.total_steps
        try:
            while self.env_steps < total:
                if self._should_stop(stop_at_steps, stop):
                    return self._stop(new_steps=self.env_steps > first_step)
                self._step(started)
        finally:
            self.monitor.close()
        if self._saved_at != self.env_steps:
            self._save()
        checksums = self._check_in_sync()
        if self.ranks.is_main:
            summary = {"env_steps": self.env_steps, "wall_seconds": self.elapsed, "train_seconds": self.train_seconds,
                       "eval_success": self._last_success, "world": self.ranks.world, "weight_checksums": checksums,
                       **self._hardware(), **self._as_run(), "threads": self.threads,
                       "capture_seconds": round(self.agent.graphs.seconds, 1),
                       "compile_seconds": round(self.compile_seconds(), 1),
                       "device_plan": self.plan.record(), "fingerprint": self.config.fingerprint}  # fmt: skip
            atomic_write(self.out / "done.json", json.dumps(summary, indent=1).encode())
        return 0

    def _step(self, started: float) -> None:
        """One step of every environment, the update when due, then metrics, progress and checkpoint when due."""
        tick = time.perf_counter()
        candidates = [c for shard in self.shards for c in shard.recorder.candidates()]
        batch = self.agent.lm.collate(  # every rank this process holds acts in one pass
            [p for shard in self.shards for p in shard.recorder.prompts()],
            [[self.action_tokens[a] for a in c] for c in candidates],
            [c.tolist() for c in candidates],
        )
        choices, extras = self.algo.act(batch, [shard.generator for shard in self.shards])
        finished = succeeded = 0
        width = len(candidates) // len(self.shards)
        for index, shard in enumerate(self.shards):
            rows = slice(index * width, (index + 1) * width)
            obs, rewards, terminated, truncated, infos = shard.envs.step(
                [ACTION_VOCABULARY[c[k]] for c, k in zip(candidates[rows], choices[rows])]
            )
            own = {key: values[rows] for key, values in extras.items()}
            for episode in shard.recorder.step(choices[rows], rewards, terminated, truncated, obs, infos, own):
                self.algo.add(episode, index)
                if shard.goals is not None:
                    shard.goals.observe(episode.goal, episode.terminated, episode.described)
                finished += 1
                succeeded += int(episode.terminated)
        self.window[0] += finished
        self.window[1] += succeeded
        self.monitor.episodes(finished, succeeded)
        self.env_steps += self.config.num_envs
        updates_before = self.algo.updates
        if self.algo.update_due(self.env_steps):
            self.algo.update([shard.recorder for shard in self.shards], self.env_steps)
        self.train_seconds += time.perf_counter() - tick
        self.elapsed = time.perf_counter() - started
        if self.monitor.scalars(self.env_steps, self.elapsed, self.algo):
            self._check_health()  # the statistics were just read: the losses' health comes with them
        if evaluates_at(self.config, self.env_steps):
            self._log_row()
        self.monitor.progress(self.env_steps, self.elapsed, self._setup_cost)
        every = self.config.checkpoint.every_updates
        if self.algo.updates // every > updates_before // every:
            self._save()

    def compile_seconds(self) -> float:
        """Seconds this run has spent compiling (`model.compile`), not counting other runs in its process."""
        return compile_seconds() - self._compiled_before

    def _setup_cost(self) -> str:
        """What capturing graphs and compiling blocks have cost this run, for the progress line ("" where neither
        runs): the first calls of each shape are slower, and this says by how much."""
        graphs, compiled = self.agent.graphs, self.compile_seconds()
        if not (graphs.enabled or compiled):
            return ""
        return f", {graphs.captured} graphs captured, capture+compile {duration(graphs.seconds + compiled)}"

    def _stop(self, new_steps: bool) -> int:
        """Checkpoint what this process added (if anything) and say "requeue me"."""
        if not new_steps:
            message = f"stopped at {self.env_steps} steps, before any new step; nothing new to checkpoint"
            print(f"{self.out}: {message}", file=sys.stderr)
            return EXIT_PREEMPTED
        if self._saved_at != self.env_steps:
            self._save()
        print(f"{self.out}: checkpointed at {self.env_steps} steps; run again to resume", file=sys.stderr)
        return EXIT_PREEMPTED

    def _finished(self) -> bool:
        """Whether done.json marks this run finished; one of another configuration is refused."""
        try:
            summary = runfiles.finished(self.out)
        except runfiles.RunStateError as error:
            raise RunDirectoryError(str(error)) from None
        if summary is None:
            return False
        if summary.get("fingerprint") != self.config.fingerprint:
            raise RunDirectoryError(
                f"{self.out} holds a finished run of another configuration (fingerprint {summary.get('fingerprint')}, "
                f"this run {self.config.fingerprint}); use a new output_dir"
            )
        return True

    def _hardware(self) -> dict:
        """GPUs used (for the GPU-hour calibration of the workflow's budget), and the CPU and its kernels: other
        kernels round float reductions differently, and through them the sampled actions (cpu.py)."""
        gpus = {"gpus": self.gpus, "gpu_name": self.plan.gpu}
        image = image_identity()
        return gpus | {
            "cpu_name": cpu_name(),
            "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
            "container": image and image["path"],  # the image this process ran in (None outside one)
            "image": image,
        }

    def _gpus(self) -> int:
        """The GPUs the run's processes compute on, each counted once (processes may share one); 0 on CPUs."""
        if self.plan.gpu is None:
            return 0
        return len(set(self.ranks.gather_strings(str(torch.cuda.get_device_properties(self.plan.device).uuid))))

    def _as_run(self) -> dict:
        """Settings resolved at run time (for the hyperparameter tables): compute dtype, LoRA's modules and how far
        its adapters moved; the SHA-256 of the weights a local model folder held when the run loaded them, or the
        commit of a hub model's cached files."""
        return {
            "dtype": self.plan.dtype,
            "lora_target_modules": lora_target_modules(self.agent.lm.model),
            "lora_b_norm": adapter_norm(self.agent.lm.model),
            "model_sha256": self.model_sha256,
            "model_commit": self.agent.source.commit,  # at load time
            "model_network": self.network,
            "hub_offline": hub_offline(),
            "weights": weights_record(self.agent.lm.model),
            "optimizers": optimizer_record(self.agent, self.algo.optimizers),
            "resumes": self.resumes,
        }

    def _should_stop(self, stop_at_steps: int | None, stop: threading.Event | None) -> bool:
        requested = stop is not None and stop.is_set()
        return self.ranks.any(requested or (stop_at_steps is not None and self.env_steps >= stop_at_steps))

    # -- metrics ---------------------------------------------------------------------------------
    def _log_row(self) -> None:
        self._check_health()
        if self.plan.loss_scaling:
            share, self._skipped = self.algo.health.skipped_share(self._skipped)
            if share > 0.5 and self.ranks.is_main:
                print(
                    f"warning: {self.out}: the float16 loss scaler skipped {share:.0%} of the optimizer steps since "
                    "the last metrics row (their gradients overflowed float16): use bfloat16 where the GPU has it, "
                    "or lower learning rates (docs/trainer.md)",
                    file=sys.stderr,
                )
        metrics = self._evaluate(self.config.eval.start_rounds if self.env_steps == 0 else 1)
        episodes, successes = self.ranks.sum([float(self.window[0]), float(self.window[1])])
        self.episodes += int(episodes)
        self.window = [0, 0]
        stats = self.algo.pop_stats()  # each process's, over its ranks: their mean over the processes
        maxima = {k: max(self.ranks.gather(v)) for k, v in stats.items() if k in MAXIMA}  # the largest of any
        means = self.ranks.sum(list(stats.values()))
        stats = {k: type(v)(m / self.ranks.world) for (k, v), m in zip(stats.items(), means)} | maxima
        seconds, steps, updates = self.last_row
        span = max(self.elapsed - seconds, 1e-9)
        row = {
            "env_steps": self.env_steps,
            "wall_seconds": self.elapsed,
            "train_seconds": self.train_seconds,
            "episodes": self.episodes,
            "train_success": successes / episodes if episodes else float("nan"),
            **metrics,
            **stats,
            "updates_per_s": (self.algo.updates - updates) / span,
            "env_steps_per_s": (self.env_steps - steps) / span,
        }
        if self.goals is not None:
            goals = self.goals.statistics()
            row["goals_known"] = goals.pop("goals_known")
            row["goal_buckets"] = json.dumps(goals, sort_keys=True)
            self.monitor.goals({"known": row["goals_known"], **goals}, self.env_steps)
        self.last_row = (self.elapsed, self.env_steps, self.algo.updates)
        self._last_success = metrics["eval_success"]
        if self.ranks.is_main:
            self.metrics.append(row)
        self.monitor.evaluation(row)

    def _evaluate(self, rounds: int) -> dict[str, float]:
        """The evaluation's success rates, the mean of `rounds` rounds (each its own random numbers) with the standard
        error of that mean; and on the main rank the planner probe's measures."""
        results = []
        for _ in range(rounds):
            policy = lambda: agent_policy(self.agent, self.config, self.eval_rounds)  # noqa: E731
            results.append(evaluate(policy, self.config, self.ranks))
            self.eval_rounds += 1
        metrics = {key: float(np.mean([r[key] for r in results])) for key in results[0]}
        if rounds > 1:
            metrics["eval_success_se"] = float(np.std([r["eval_success"] for r in results], ddof=1) / np.sqrt(rounds))
        if self.probe is not None and self.ranks.is_main:
            alpha = self.algo.alpha if self.config.algorithm == "sac" else None
            metrics |= planner_probe.measure(self.agent, self.probe, alpha)
        return metrics

    # -- checkpoint and resume -------------------------------------------------------------------
    def _checksum(self) -> float:
        """This process's checksum of the trained weights."""
        with torch.no_grad():
            return sum(
                float(v.double().sum()) for v in self.agent.mutable_state_dict().values() if v.is_floating_point()
            )

    def _check_in_sync(self) -> list[float]:
        """Every rank's checksum of the trained weights; they must agree (gradients are averaged)."""
        checksums = self.ranks.gather(self._checksum())
        if len(set(checksums)) > 1:
            raise RuntimeError(f"data-parallel ranks are out of sync: weight checksums {checksums}")
        return checksums

    def _save(self) -> None:
        self._check_health()
        self._check_finite()  # a checkpoint of non-finite state would be resumed from, and diverge again
        checksum = self._check_in_sync()[0]
        shared = {
            "format": CHECKPOINT_FORMAT,
            "fingerprint": self.config.fingerprint,
            "threads": self.threads,
            "agent": self.agent.mutable_state_dict(),
            "algo": self.algo.state_dict(),
            "counters": {
                "env_steps": self.env_steps,
                "episodes": self.episodes,
                "eval_rounds": self.eval_rounds,
                "metrics_rows": self.metrics.rows,
                "elapsed": self.elapsed,
                "train_seconds": self.train_seconds,
                "last_row": list(self.last_row),
                "last_success": self._last_success,
                "weights_checksum": checksum,
                "resumes": self.resumes,
                "network": self.network,
            },  # fmt: skip
        }
        local = {
            "shards": [shard.state_dict() for shard in self.shards],
            "algo": self.algo.local_state_dict(),
            "torch_rng": torch.get_rng_state(),
            "window": list(self.window),
            "monitor": self.monitor.state_dict(),
        }
        self.checkpoints.save(self.env_steps, shared, local)
        self._saved_at = self.env_steps

    def _load_checkpoint(self) -> tuple[dict, dict] | None:
        """The newest good checkpoint, if any, once it is known to belong to this run."""
        loaded = self.checkpoints.load_latest()
        if loaded is None:
            return None
        shared = loaded[0]
        where = self.checkpoints.directory
        if shared.get("format", 1) != CHECKPOINT_FORMAT:
            raise CheckpointError(
                f"the checkpoints in {where} were written by another version of the trainer (format "
                f"{shared.get('format', 1)}, this one reads {CHECKPOINT_FORMAT}); finish the run with that version "
                "or use a new output_dir"
            )
        if shared["fingerprint"] != self.config.fingerprint:
            raise CheckpointError(
                f"the checkpoints in {where} belong to another configuration "
                f"(fingerprint {shared['fingerprint']}, this run {self.config.fingerprint}); use a new output_dir"
            )
        if not self.ranks.all(shared["threads"] == self.threads):
            raise CheckpointError(
                f"the checkpoints in {where} were made with {shared['threads']} torch threads, this process has "
                f"{self.threads}, and results depend on it; set threads: {shared['threads']} in the run "
                "configuration to resume"
            )
        return loaded

    def _resume(self) -> dict | None:
        """Load the checkpoint found at start, if any; its monitor state for this rank ({} in a checkpoint from before
        it was kept), None without a checkpoint."""
        if self._checkpoint is None:
            return None
        (shared, local), self._checkpoint = self._checkpoint, None
        self.agent.load_mutable_state_dict(shared["agent"])
        self.algo.load_state_dict(shared["algo"])
        counters = shared["counters"]
        self.env_steps, self.episodes, self.eval_rounds = (
            counters["env_steps"],
            counters["episodes"],
            counters["eval_rounds"],
        )
        self.elapsed, self.last_row, self._last_success = (
            counters["elapsed"],
            tuple(counters["last_row"]),
            counters["last_success"],
        )
        self.train_seconds = counters["train_seconds"]
        # What this resume loaded against what was saved: the first job's check that a requeue resumes its run.
        loaded = {"env_steps": self.env_steps, "saved": counters.get("weights_checksum"), "loaded": self._checksum()}
        self.resumes = [*counters.get("resumes", []), loaded]
        self.network = [*counters.get("network", []), *self.network]
        shards = local.get("shards", [local])  # one rank's state at the top: a checkpoint from before ranks were held
        if len(shards) != len(self.shards):
            raise CheckpointError(
                f"the checkpoints in {self.checkpoints.directory} hold {len(shards)} data-parallel ranks per process, "
                f"this run {len(self.shards)}: resume with the same ranks and processes"
            )
        for shard, state in zip(self.shards, shards):
            shard.load_state_dict(state)
        self.algo.load_local_state_dict(local["algo"])
        torch.set_rng_state(local["torch_rng"])
        self.window = list(local["window"])
        if self.ranks.is_main:
            self.metrics.restore(counters["metrics_rows"])
        self._saved_at = self.env_steps
        print(f"{self.out}: resumed at {self.env_steps} environment steps", file=sys.stderr)
        return local.get("monitor", {})


def _weights_sha256(model: ModelConfig) -> str | None:
    """SHA-256 of a local model folder's single `model.safetensors` (None for a hub model, whose pinned revision says
    which it is, or sharded weights)."""
    return runfiles.file_sha256(Path(model.name_or_path).expanduser() / "model.safetensors")
