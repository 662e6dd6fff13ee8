"""PPO-GLAM (paper Table 1) and its hindsight variants (Appendix G).

Every `rollout_steps` transitions (all environments together): GAE(lambda) advantages, then `epochs`
passes over the data in minibatches, each minimising, as GLAM's PPO updater does,

    L = L_pi - entropy_coef * H(pi) + value_coef * L_V
    L_V = E[max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)]       (`value_loss: clipped`)

with L_pi the clipped surrogate (`loss: clip`) or the KL-penalised one (`loss: kl`), V_old the value the
advantages were computed with and eps the policy's clip. `value_loss: mse` is E[(V - R)^2] (with
value_coef 0.25, the loss before GLAM's was followed); `normalize_advantages` standardises the
advantages of each minibatch (GLAM does not).

With HER, every goal the social partner reported in a rollout segment adds a relabelled copy of the
segment up to that step (reward 1 there, then the end). Its importance ratio compares the new policy
under the new goal with the behaviour policy under the original goal, pi(a|s,g') / pi_old(a|s,g), so it is
not 1 even in the first epoch; the KL term likewise compares pi_old(.|s,g) with pi(.|s,g'). `aligned_only`
keeps goals that are sub-goals of the original; `center_clip` clips around the first-epoch ratio r0
instead of 1: clip(r, r0 - eps, r0 + eps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sacglam_core.agent import CandidateBatch, CandidateDistribution, GlamAgent
from sacglam_core.agent.batch import HostBatch, padded_rows, rows_for
from sacglam_core.agent.lm import DEFAULT
from sacglam_core.algos.precision import adam, grad_scaler, step
from sacglam_core.algos.stats import Health, UpdateStats
from sacglam_core.config import RunConfig
from sacglam_core.distributed import Ranks
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.trajectories import Episode, EpisodeRecorder, relabelled

SCORING_CHUNK = 256  # states per pass when a rollout's states are scored with the current weights
SCORING_ROWS = 64  # ... padded to a multiple of this many: a few static shapes


def gae(
    rewards: np.ndarray, values: np.ndarray, last_value: float, terminal: bool, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns of one segment (values[t] = V(s_t));
    `last_value` is V(s_T), ignored when the segment ends in a terminal state."""
    advantages = np.zeros(len(rewards), dtype=np.float32)
    next_value, running = (0.0 if terminal else last_value), 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values.astype(np.float32)


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """-E[min(r A, clip(r, low, high) A)] (paper eq. 4; low/high are 1 -/+ eps, or r0 -/+ eps centred); the
    expectation over the rows that `weight` marks real (all without it)."""
    return _mean(torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, low, high)), weight)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """E[(V - R)^2], or with `clip` the clipped form: V may not earn credit beyond V_old -/+ clip."""
    loss = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        loss = torch.max(loss, (clipped - returns) ** 2)
    return _mean(loss, weight)


def ppo_objective(
    pg_loss: torch.Tensor, entropy: torch.Tensor, value: torch.Tensor, entropy_coef: float, value_coef: float
) -> torch.Tensor:
    return pg_loss - entropy_coef * entropy + value_coef * value


def kl_penalised(
    ratio: torch.Tensor, advantages: torch.Tensor, kl: torch.Tensor, beta: float, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """-E[r A - beta KL(pi_old || pi)] (paper eq. 5, written as a loss to minimise)."""
    return _mean(-(ratio * advantages) + beta * kl, weight)


def _mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    return x.mean() if weight is None else weighted_mean(x, weight)


def weighted_mean(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The mean of x weighted by `weight` (over the real entries of a padded chunk, each rank's alike)."""
    return (x * weight).sum() / weight.sum()


def normalized(advantages: torch.Tensor, real: torch.Tensor, group: torch.Tensor, groups: int) -> torch.Tensor:
    """Each rank's minibatch of advantages standardised by its own mean and unbiased standard deviation (torch.std's),
    over its real rows; a rank's minibatch of one row is left as it is."""
    member = torch.nn.functional.one_hot(group, groups).to(advantages.dtype) * real[:, None]  # [rows, ranks]
    count = member.sum(0)
    mean = (member * advantages[:, None]).sum(0) / count.clamp(min=1)
    centred = advantages - mean[group]
    std = ((member * centred[:, None].square()).sum(0) / (count - 1).clamp(min=1)).sqrt()
    return torch.where(count[group] > 1, centred / (std[group] + 1e-8), advantages)


@dataclass
class Transition:
    prompt: list[int]
    candidates: np.ndarray  # action-vocabulary ids
    action: int  # position in candidates
    old_logp: float  # log pi_old(a|s, g) of the behaviour policy, under the original goal
    old_log_probs: np.ndarray  # log pi_old(.|s, g) over the candidates (for the KL loss)
    advantage: float
    ret: float
    old_value: float  # V(s_t) the advantage was computed with (the centre of the value clip)
    r0: float = 1.0  # first-epoch ratio (centre of the clip when center_clip)
    relabelled: bool = False  # a hindsight copy, under a goal the behaviour policy did not pursue


class PPO:
    def __init__(self, agent: GlamAgent, config: RunConfig, ranks: Ranks) -> None:
        self.agent, self.config, self.cfg, self.ranks = agent, config, config.ppo, ranks
        self.minibatches = max(1, math.ceil(self.cfg.rollout_steps / self.cfg.minibatch_size))
        self.params = agent.lm.parameters_of(DEFAULT) + list(agent.value_head.parameters())
        self.optimizer = adam(self.params, self.cfg.lr)
        self.scaler = grad_scaler(agent)
        self.generators = [torch.Generator().manual_seed(config.seed * 1000 + rank) for rank in ranks.held]
        self.updates = 0
        self.segments: list[list[Episode]] = [[] for _ in ranks.held]  # each rank's, since its last update
        self._action_tokens = [agent.tokens.action(a) for a in ACTION_VOCABULARY]
        self.stats = UpdateStats()
        # float16's gradients overflow now and then (the scaler skips the step): only its losses tell divergence
        gradients = () if agent.plan.loss_scaling else ("gradient",)
        self.health = Health(("policy loss", "value loss", *gradients), agent.lm.device, "minibatch step")
        self._env_steps = 0  # of the update under way
        # Device work alone, each wrapped once (a captured graph per shape on a GPU)
        self._acting, self._kl = agent.captured("act-ppo", self._acting_pass), agent.captured("ppo-kl", self._kl_pass)
        self._score, self._learner = agent.captured("ppo-score", self._score_pass), agent.captured("ppo", self._learn)

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers that train the LLM's weights, by name."""
        return {"policy": self.optimizer}

    # -- acting ----------------------------------------------------------------------------------
    def act(self, batch: HostBatch, generators: list[torch.Generator]) -> tuple[list[int], dict[str, list]]:
        out = self._acting({"states": batch})
        policy = CandidateDistribution(out["log_probs"], out["mask"])
        choice = policy.sample(generators).tolist()
        # one read of what the rollout keeps: each prompt's value and log-probabilities
        host = torch.cat([out["value"].float()[:, None], out["log_probs"].float()], 1).cpu().numpy()
        log_probs = host[:, 1:]
        return choice, {
            "logp": log_probs[range(len(choice)), choice].tolist(),
            "value": host[:, 0].tolist(),
            "log_probs": [row[:n].copy() for row, n in zip(log_probs, batch.sizes)],
        }

    @torch.no_grad()
    def _acting_pass(self, batches: dict[str, CandidateBatch], _) -> dict[str, torch.Tensor]:
        policy, out = self.agent.policy(batches["states"], hidden=True)
        return {"log_probs": policy.log_probs, "mask": policy.mask, "value": self.agent.value(out)}

    def add(self, episode: Episode, shard: int = 0) -> None:
        """A finished episode of the `shard`-th rank this process holds."""
        self.segments[shard].append(episode)

    def update_due(self, env_steps: int) -> bool:
        return env_steps % self.cfg.rollout_steps == 0

    # -- learning --------------------------------------------------------------------------------
    def update(self, recorders: list[EpisodeRecorder], env_steps: int) -> None:
        """Each rank's rollout (its segments and those its recorder cuts open) in minibatches of its own, shuffled by
        its own generator; the ranks' k-th minibatches make one step together."""
        self._env_steps = env_steps
        segments = [own + recorder.cut() for own, recorder in zip(self.segments, recorders)]
        self.segments = [[] for _ in segments]
        data = self._transitions(segments)
        per_batch = [max(1, math.ceil(len(d) / self.minibatches)) for d in data]
        for _ in range(self.cfg.epochs):
            orders = [torch.randperm(len(d), generator=g).tolist() for d, g in zip(data, self.generators)]
            for k in range(self.minibatches):  # the same number of steps on every rank
                self._minibatch_step(
                    [
                        [d[i] for i in order[k * n : (k + 1) * n]] or [d[order[0]]]
                        for d, order, n in zip(data, orders, per_batch)
                    ]
                )
        if self.config.monitor.policy_kl_every:
            self._policy_kl([[t for t in d if not t.relabelled] for d in data])
        self.updates += 1

    def _policy_kl(self, data: list[list[Transition]]) -> None:
        """KL(pi before the update || pi after it) on each rank's rollout states under their own goals, where the
        policy before the update is the one that acted (`old_log_probs`): one measurement per rank, as processes of
        their own would measure it."""
        flat = [t for d in data for t in d]
        kl = []
        for start in range(0, len(flat), SCORING_CHUNK):
            chunk = flat[start : start + SCORING_CHUNK]
            rows = rows_for(len(chunk), SCORING_ROWS)
            states = self._states(chunk).padded(rows)
            before = padded_rows({"before": self._old_log_probs(chunk, states.arrays["candidate_mask"].shape[1])}, rows)
            kl.append(self._kl({"states": states}, before)["kl"][: len(chunk)])
        if kl:
            measured = [i for i, d in enumerate(data) if d]
            rank = torch.as_tensor(np.repeat(np.arange(len(measured)), [len(data[i]) for i in measured]))
            kl_rows = torch.cat(kl).float()
            sums = torch.zeros(len(measured), device=kl_rows.device).index_add_(0, rank.to(kl_rows.device), kl_rows)
            counts = torch.as_tensor([len(data[i]) for i in measured], dtype=torch.float32, device=kl_rows.device)
            self.stats.add(policy_kl=sums / counts)

    @torch.no_grad()
    def _kl_pass(self, batches: dict[str, CandidateBatch], tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        after, _ = self.agent.policy(batches["states"])
        before = CandidateDistribution(tensors["before"].to(after.log_probs.dtype), after.mask)
        return {"kl": before.kl(after)}  # per state, the copies that pad the batch included: the caller drops them

    @staticmethod
    def _old_log_probs(chunk: list[Transition], slots: int) -> np.ndarray:
        """log pi_old(.|s, g) of each transition over its candidate slots (0 in empty slots)."""
        before = np.zeros((len(chunk), slots), dtype=np.float32)
        for row, t in zip(before, chunk):
            row[: len(t.old_log_probs)] = t.old_log_probs
        return before

    def _states(self, chunk: list[Transition]) -> HostBatch:
        return self.agent.collate(
            [t.prompt for t in chunk],
            [[self._action_tokens[a] for a in t.candidates] for t in chunk],
            [list(t.candidates) for t in chunk],
        )

    def _transitions(self, segments: list[list[Episode]]) -> list[list[Transition]]:
        """Each rank's original segments and, with HER, their relabelled copies, with advantages and returns (the
        states of all ranks scored together)."""
        her = self.config.her
        pieces = []  # (rank, segment, whether it is a relabelled copy)
        for shard, own in enumerate(segments):
            for segment in own:
                pieces.append((shard, segment, False))
                if her.enabled:
                    pieces += [(shard, copy, True) for copy in relabelled(segment, aligned_only=her.aligned_only)]
        data: list[list[Transition]] = [[] for _ in segments]
        scored = self._score_states([(segment, relabel) for _, segment, relabel in pieces])
        for (shard, segment, relabel), (prompts, values, logp) in zip(pieces, scored):
            data[shard] += self._segment_transitions(segment, relabel, prompts, values, logp)
        shares = [(len(d) - sum(s.length for s in own)) / max(len(d), 1) for own, d in zip(segments, data)]
        self.stats.add(her_share=sum(shares) / len(shares))  # the mean of the ranks' shares
        return data

    @torch.no_grad()
    def _score_states(self, pieces: list[tuple[Episode, bool]]) -> list[tuple[list, np.ndarray, np.ndarray]]:
        """Each piece's prompts, V(s_t, g) for t = 0..T and log pi(a_t|s_t, g) for t < T with the current weights,
        the states of all pieces scored together, SCORING_CHUNK at a time: a pass per segment would be dozens of
        small ones per rollout, each with its own read."""
        tokens, ids = self.agent.tokens, self._action_tokens
        prompts, candidates, actions = [], [], []
        for segment, _ in pieces:
            goal = tokens.goal(segment.goal)
            prompts += [tokens.join(goal, o.tolist()) for o in segment.observations]
            candidates += [list(c) for c in segment.candidates]
            actions += [*segment.actions, 0]  # s_T has no action: its value alone is read
        read = []
        for start in range(0, len(prompts), SCORING_CHUNK):
            chunk = range(start, min(start + SCORING_CHUNK, len(prompts)))
            rows = rows_for(len(chunk), SCORING_ROWS)
            batch = self.agent.collate(
                [prompts[i] for i in chunk],
                [[ids[a] for a in candidates[i]] for i in chunk],
                [candidates[i] for i in chunk],
            ).padded(rows)
            action = padded_rows({"action": np.asarray([actions[i] for i in chunk], dtype=np.int64)}, rows)
            out = self._score({"states": batch}, action)
            read.append(out["value_logp"].cpu().numpy()[: len(chunk)])
        values, logp = np.concatenate(read).T if read else (np.zeros(0), np.zeros(0))
        out, start = [], 0
        for segment, _ in pieces:
            end = start + segment.length + 1
            out.append((prompts[start:end], values[start:end], logp[start : end - 1]))
            start = end
        return out

    @torch.no_grad()
    def _score_pass(
        self, batches: dict[str, CandidateBatch], tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        policy, out = self.agent.policy(batches["states"], hidden=True)
        logp = policy.log_probs.gather(1, tensors["action"][:, None]).squeeze(1)
        return {"value_logp": torch.stack([self.agent.value(out).float(), logp.float()], 1)}

    def _segment_transitions(
        self, segment: Episode, relabel: bool, prompts: list, fresh_values: np.ndarray, new_logp: np.ndarray
    ) -> list[Transition]:
        values = fresh_values[:-1] if relabel else np.asarray(segment.extras["value"], dtype=np.float32)
        advantages, returns = gae(
            np.asarray(segment.rewards, dtype=np.float32),
            values,
            float(fresh_values[-1]),
            segment.terminated,
            self.cfg.gamma,
            self.cfg.gae_lambda,
        )
        old_logp = segment.extras["logp"]
        log_probs = segment.extras["log_probs"]
        cands = segment.candidates
        transitions = []
        for t in range(segment.length):
            r0 = float(np.exp(new_logp[t] - old_logp[t])) if relabel else 1.0
            transitions.append(
                Transition(
                    prompts[t],
                    cands[t],
                    segment.actions[t],
                    old_logp[t],
                    log_probs[t],
                    advantages[t],
                    returns[t],
                    float(values[t]),
                    r0,
                    relabel,
                )
            )
        return transitions

    def _minibatch_step(self, chunks: list[list[Transition]]) -> None:
        """One gradient step on the ranks' minibatches together: each row weighs 1 / (ranks x its rank's rows), so
        that the loss is the mean of the ranks' means; with static shapes the rows are padded to a multiple of a
        quarter minibatch with copies that are not `real`."""
        cfg = self.cfg
        chunk = [t for c in chunks for t in c]
        rows = rows_for(len(chunk), max(1, cfg.minibatch_size // 4) if self.agent.lm.shapes.static else 1)
        states = self._states(chunk).padded(rows)
        slots = states.arrays["candidate_mask"].shape[1]
        column = lambda name: np.asarray([getattr(t, name) for t in chunk], dtype=np.float32)  # noqa: E731
        arrays = {
            "action": np.asarray([t.action for t in chunk], dtype=np.int64),
            "old_logp": column("old_logp"),
            "advantage": column("advantage"),
            "center": column("r0") if cfg.center_clip else np.ones(len(chunk), dtype=np.float32),
            "ret": column("ret"),
            "old_value": column("old_value"),
            "before": self._old_log_probs(chunk, slots)
            if cfg.loss == "kl"
            else np.zeros((len(chunk), slots), np.float32),
            "share": np.concatenate([np.full(len(c), 1 / (len(chunks) * len(c)), np.float32) for c in chunks]),
            "group": np.concatenate([np.full(len(c), k, np.int64) for k, c in enumerate(chunks)]),
        }
        arrays = padded_rows(arrays, rows) | {"env_steps": np.asarray(self._env_steps, dtype=np.float64)}
        self.stats.add(**self._learner({"states": states}, arrays))

    def _learn(self, batches: dict[str, CandidateBatch], rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One gradient step on staged tensors, device work alone (a captured graph on a GPU); its statistics. Means
        weigh the real rows by their rank's share (the mean of the ranks' means over their real rows)."""
        cfg, agent, batch, groups = self.cfg, self.agent, batches["states"], len(self.ranks.held)
        weight = torch.where(batch.real, rows["share"], 0)
        mean = lambda x: weighted_mean(x, weight)  # noqa: E731
        policy, out = agent.policy(batch, hidden=True)
        logp = policy.log_probs.gather(1, rows["action"][:, None]).squeeze(1)
        advantages = rows["advantage"]
        if cfg.normalize_advantages:
            advantages = normalized(advantages, batch.real, rows["group"], groups)
        ratio = torch.exp(logp - rows["old_logp"])
        stats = {}
        if cfg.loss == "clip":
            center = rows["center"]
            pg_loss = clipped_surrogate(ratio, advantages, center - cfg.clip, center + cfg.clip, weight)
            stats["clipfrac"] = mean(((ratio - center).abs() > cfg.clip).float())
        else:
            old = CandidateDistribution(rows["before"].to(policy.log_probs.dtype), policy.mask)
            kl = old.kl(policy)
            pg_loss = kl_penalised(ratio, advantages, kl, cfg.kl_coef, weight)
            stats["kl"] = mean(kl).detach()
        clip = cfg.clip if cfg.value_loss == "clipped" else None
        v_loss = value_loss(agent.value(out), rows["old_value"], rows["ret"], clip, weight)
        entropy = mean(policy.entropy())
        loss = ppo_objective(pg_loss, entropy, v_loss, cfg.entropy_coef, cfg.value_coef)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()  # the scaler is a no-op unless the LLM computes in fp16
        self.ranks.average_gradients(self.params)
        norm, skipped = step(self.optimizer, self.scaler, self.params, cfg.max_grad_norm)
        self.health.stepped(skipped)
        self.health.record(rows["env_steps"], **{"policy loss": pg_loss, "value loss": v_loss, "gradient": norm})
        self.health.finish_update()
        with torch.no_grad():
            approx_kl = mean((ratio - 1) - (logp - rows["old_logp"]))
        detached = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy}
        return stats | {"approx_kl": approx_kl} | {k: v.detach() for k, v in detached.items()}

    def pop_stats(self) -> dict[str, float]:
        return self.stats.pop() | {"updates": self.updates}

    def recent_stats(self) -> dict[str, float]:
        """Means since the last call (the monitor's), with float16's skipped steps; leaves them to `pop_stats`."""
        skipped = {"skipped_steps": float(self.health.skipped)} if self.agent.plan.loss_scaling else {}
        return self.stats.unseen() | {"updates": self.updates} | skipped

    def divergence(self) -> tuple[str, int, int] | None:
        """What first went non-finite in the minibatch steps, at which step (counted over every update's minibatches)
        and environment step (None: nothing)."""
        return self.health.divergence()

    def trained_tensors(self) -> list[torch.Tensor]:
        """Everything a checkpoint keeps that training changes on the device: the optimizer's state."""
        return [t for s in self.optimizer.state.values() for t in s.values() if t.is_floating_point()]

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]
        self.health.start_at(self.updates * self.cfg.epochs * self.minibatches)
        self.scaler.load_state_dict(state["scaler"])

    def local_state_dict(self) -> dict:
        return {
            "generators": [g.get_state() for g in self.generators],
            "segments": [[e.state_dict() for e in own] for own in self.segments],
            "stats": self.stats.state_dict(),
        }

    def load_local_state_dict(self, state: dict) -> None:
        for generator, generator_state in zip(self.generators, state["generators"], strict=True):
            generator.set_state(generator_state)
        self.stats.load_state_dict(state["stats"])
        self.segments = [[Episode.from_state_dict(s) for s in own] for own in state["segments"]]
