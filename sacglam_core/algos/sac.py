"""Discrete SAC-GLAM (paper section 2, Appendices C-F, Table 2), optionally with hindsight relabelling.

The actor is the GLAM policy over each state's candidate actions; the critic an MLP head on the LLM
(see agent/critic.py). Every `update_every` environment steps, `updates_per_cycle` gradient updates:

    y      = sum_{i<n} gamma^i r_{t+i} + gamma^n * E_{a'~pi(.|s_{t+n})}[Q_targ(s_{t+n}, a') - alpha log pi(a'|s_{t+n})]
    L_Q    = (Q(s_t, a_t) - y)^2                                            (paper eq. 3)
    L_pi   = E_{a~pi(.|s_t)}[alpha log pi(a|s_t) - Q(s_t, a)]                (exact expectation over candidates)
    L_alpha = E_{a~pi(.|s_t)}[-alpha (log pi(a|s_t) + H_target)]

During the warm-up (`warmup_cycles` update cycles by default, see SACConfig) only the critic learns.
Episodes enter the replay buffer when they end, with their hindsight copies when HER is on.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from sacglam_core.agent import CandidateBatch, CandidateDistribution, GlamAgent
from sacglam_core.agent.batch import HostBatch
from sacglam_core.agent.lm import DEFAULT
from sacglam_core.algos.precision import adam, grad_scaler, step
from sacglam_core.algos.stats import Health, UpdateStats
from sacglam_core.config import RunConfig
from sacglam_core.distributed import Ranks
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.replay import ReplayBuffer
from sacglam_core.trajectories import Episode, EpisodeRecorder, goal_table, relabelled


def soft_state_value(policy: CandidateDistribution, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """V(s) = E_{a~pi}[Q(s, a) - alpha log pi(a|s)], exact over the candidates. [B]"""
    return (policy.probs * (q - alpha * policy.log_probs)).sum(1)


def critic_targets(reward: torch.Tensor, discount: torch.Tensor, next_value: torch.Tensor) -> torch.Tensor:
    """The n-step target of eq. 3; `discount` is gamma^n, or 0 when the episode ended in between."""
    return reward + discount * next_value


def actor_loss(policy: CandidateDistribution, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    return (policy.probs * (alpha * policy.log_probs - q)).sum(1).mean()


def boltzmann_policy(policy: CandidateDistribution, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """softmax(Q / alpha) over each state's candidates (0 on absent ones): the minimiser of both actor losses."""
    return torch.softmax((q / alpha).masked_fill(~policy.mask, -math.inf), dim=1)


def forward_kl_actor_loss(policy: CandidateDistribution, q: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """Cross-entropy from the Boltzmann policy of Q to pi (forward KL up to a constant). Its gradient on the
    policy's logits is pi - softmax(Q / alpha), which does not vanish when pi is near one-hot."""
    target = boltzmann_policy(policy, q, alpha).detach()
    return -(target * policy.log_probs).sum(1).mean()


ACTOR_LOSSES = {"reverse_kl": actor_loss, "forward_kl": forward_kl_actor_loss}


def target_statistics(policy: CandidateDistribution, q: torch.Tensor, alpha: float | torch.Tensor) -> dict:
    """What the actor's loss pulls the policy towards, softmax(Q / alpha) over each state's candidates: its
    entropy (next to the policy's, it says whether the actor follows its target or overshoots it) and how
    far apart the critic puts the candidates (max - min of Q)."""
    absent = ~policy.mask
    entropy = torch.special.entr(boltzmann_policy(policy, q, alpha)).sum(1)  # entr(0) = 0: absent candidates
    q_range = q.masked_fill(absent, -math.inf).amax(1) - q.masked_fill(absent, math.inf).amin(1)
    return {"target_policy_entropy": entropy.detach().mean(), "q_range": q_range.detach().mean()}


def alpha_loss(log_alpha: torch.Tensor, policy: CandidateDistribution, target_entropy: float) -> torch.Tensor:
    # Sign convention: the target entropy is given in nats as a positive amount of entropy (the paper's 0
    # and 0.01), as in discrete SAC (Christodoulou 2019). E[log pi] + H_target = H_target - H(pi), so
    # minimising -alpha (H_target - H) raises alpha when the policy's entropy is below the target and
    # lowers it when above. We learn log(alpha), so alpha stays positive.
    probs, log_probs = policy.probs.detach(), policy.log_probs.detach()
    return (probs * (-log_alpha.exp() * (log_probs + target_entropy))).sum(1).mean()


def _concatenate(parts: list) -> list | np.ndarray:
    return [x for part in parts for x in part] if isinstance(parts[0], list) else np.concatenate(parts)


class SAC:
    def __init__(self, agent: GlamAgent, config: RunConfig, ranks: Ranks, goal_type_prior: np.ndarray) -> None:
        self.agent, self.config, self.cfg, self.ranks = agent, config, config.sac, ranks
        self.batch_size = max(1, self.cfg.batch_size // ranks.total)  # each rank's share of the global batch
        self.buffers = [  # buffer_size is the run's capacity; each rank holds its share, of its own environments
            ReplayBuffer(
                ranks.share(self.cfg.buffer_size, rank),
                self.cfg.n_step,
                self.cfg.gamma,
                goal_type_prior,
                seed=config.seed * 1000 + rank,
            )
            for rank in ranks.held
        ]
        self.actor_params = agent.lm.parameters_of(DEFAULT)
        self.critic_params = list(agent.critic.head.parameters()) + agent.critic.trainable_lm_parameters(agent.lm)
        self.actor_optimizer = adam(self.actor_params, self.cfg.actor_lr)
        ramp = self.cfg.actor_lr_ramp_updates
        self.actor_schedule = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optimizer, lambda step: min(1.0, (step + 1) / ramp) if ramp else 1.0
        )
        self.critic_optimizer = adam(self.critic_params, self.cfg.critic_lr)
        self.log_alpha = torch.tensor(math.log(self.cfg.alpha_init), device=agent.lm.device, requires_grad=True)
        self.alpha_optimizer = adam([self.log_alpha], self.cfg.alpha_lr)
        self.scalers = {
            o: grad_scaler(agent) for o in (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer)
        }
        self.updates = 0
        tokens = agent.tokens
        self._action_tokens = [tokens.action(a) for a in ACTION_VOCABULARY]
        self.stats = UpdateStats()
        # float16's gradients overflow now and then (the scaler skips the step): only its losses tell divergence
        gradients = () if agent.plan.loss_scaling else ("critic gradient", "actor gradient", "alpha gradient")
        self.health = Health(("critic loss", "actor loss", "alpha loss", *gradients), agent.lm.device)
        # The update as device work alone, wrapped once per host branch: the critic alone during warm-up, then both.
        self._learners = {
            warming_up: agent.captured(
                "sac-warmup" if warming_up else "sac", partial(self._learn, warming_up=warming_up)
            )
            for warming_up in (True, False)
        }

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers that train the LLM's weights, by name."""
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    # -- acting and data -------------------------------------------------------------------------
    def act(self, batch: HostBatch, generators: list[torch.Generator]) -> tuple[list[int], dict[str, list]]:
        return self.agent.acting_policy(batch).sample(generators).tolist(), {}

    def add(self, episode: Episode, shard: int = 0) -> None:
        """A finished episode of the `shard`-th rank this process holds, and its hindsight copies when HER is on,
        enter that rank's replay buffer."""
        buffer = self.buffers[shard]
        buffer.add_episode(episode, her=False)
        if self.config.her.enabled:
            for copy in relabelled(episode):
                buffer.add_episode(copy, her=True)

    def update_due(self, env_steps: int) -> bool:
        if env_steps % self.cfg.update_every or env_steps < self.cfg.learning_starts:
            return False
        return self.ranks.all(all(len(b) >= self.batch_size for b in self.buffers))  # every rank's holds a batch

    def update(self, recorders: list[EpisodeRecorder], env_steps: int) -> None:
        """One cycle of `updates_per_cycle` gradient updates."""
        for _ in range(self.cfg.updates_per_cycle):
            self._update(env_steps)

    def _batches(self, indices: list[np.ndarray]) -> tuple[dict[str, HostBatch], dict[str, np.ndarray]]:
        """The taken actions and all candidates at s_t, all candidates at s_{t+n} of the rows that bootstrap, and
        the rows' rewards and discounts, of the rows `indices` of each rank's buffer, together (each rank's
        share of the batch is the same size, so the mean over the rows is the mean of the ranks' means). The rows
        that bootstrap come first; a row whose n steps end the episode has discount 0, its target is the reward
        alone and s_{t+n} need not go through the LLM (HER's copies end in success, so they are often most of a
        batch). With static shapes the s_{t+n} batch holds them padded to the whole batch with copies of its first
        row (not `real`: their values read 0), so that its passes have one shape whatever the share that bootstraps
        (a captured graph, and with `model.compile` a compilation, per share would keep appearing late in a run); none
        when no row bootstraps."""
        parts = [buffer.rows(index) for buffer, index in zip(self.buffers, indices)]
        rows = {k: _concatenate([part[k] for part in parts]) for k in parts[0]}
        order = np.argsort(rows["discount"] <= 0, kind="stable")
        rows = {k: [v[i] for i in order] if isinstance(v, list) else v[order] for k, v in rows.items()}
        agent, tokens, texts = self.agent, self.agent.tokens, goal_table()[0]
        goals = [tokens.goal(texts[g]) for g in rows["goal"]]
        prompts = [tokens.join(g, o) for g, o in zip(goals, rows["obs"])]
        taken_index = [[c[a]] for c, a in zip(rows["candidates"], rows["action"])]
        batches = {
            "taken": agent.collate(prompts, [[self._action_tokens[i[0]]] for i in taken_index], taken_index, slots=1),
            "current": agent.collate(
                prompts, [[self._action_tokens[a] for a in c] for c in rows["candidates"]], rows["candidates"]
            ),
        }
        bootstrap = int((rows["discount"] > 0).sum())
        if bootstrap:
            later = list(rows["next_candidates"][:bootstrap])
            batches["following"] = agent.collate(
                [tokens.join(goals[i], rows["next_obs"][i]) for i in range(bootstrap)],
                [[self._action_tokens[a] for a in c] for c in later],
                later,
            ).padded(len(order) if agent.lm.shapes.static else bootstrap)
        arrays = {"reward": rows["reward"].astype(np.float32), "discount": rows["discount"].astype(np.float32)}
        return batches, arrays | {"rank": order // self.batch_size}  # each row's rank, among those held

    # -- learning --------------------------------------------------------------------------------
    def _update(self, env_steps: int) -> None:
        her = self.config.her
        strategy = her.sampling if her.enabled else "uniform"
        batches, arrays = self._batches([b.sample(self.batch_size, strategy, her.her_fraction) for b in self.buffers])
        every = self.config.monitor.policy_kl_every
        warming_up = self.warming_up(env_steps)
        arrays["env_steps"] = np.asarray(env_steps, dtype=np.float64)
        rank = torch.as_tensor(arrays.pop("rank"))
        # The whole update's change of pi (a critic that shares the policy's weights moves it too, warm-up included),
        # measured by passes of their own: the update stays one graph whether or not it is measured.
        before = self.agent.acting_policy(batches["current"]) if every and self.updates % every == 0 else None
        stats = self._learners[warming_up](batches, arrays)
        if before is not None:  # each rank's measurement, so that ranks held in one process measure as processes
            kl = before.kl(self.agent.acting_policy(batches["current"])).float()
            rank = rank.to(kl.device)
            means = torch.zeros(len(self.buffers), device=kl.device).index_add_(0, rank, kl) / self.batch_size
            maxima = torch.zeros(len(self.buffers), device=kl.device).scatter_reduce_(
                0, rank, kl, "amax", include_self=False
            )
            stats |= {"policy_kl": means, "policy_kl_state_max": maxima}  # one state's jump, or all moving
        self.stats.add(**stats)
        if not warming_up:
            self.actor_schedule.step()  # a learning rate held as a tensor: the next replay reads the new value
        self.updates += 1

    def _learn(
        self, batches: dict[str, CandidateBatch], tensors: dict[str, torch.Tensor], warming_up: bool
    ) -> dict[str, torch.Tensor]:
        """One gradient update on staged tensors, device work alone (a captured graph on a GPU); its statistics. Its
        losses and gradients' norms go to `health`, which tells divergence."""
        reward, discount, env_steps = tensors["reward"], tensors["discount"], tensors["env_steps"]
        alpha = self.log_alpha.exp().detach()
        stats = self._critic_update(batches["taken"], batches.get("following"), reward, discount, alpha, env_steps)
        if not warming_up:
            stats |= self._actor_update(batches["current"], alpha, env_steps)
        self.agent.critic.update_target(self.agent.lm)
        self.health.finish_update()
        return stats

    def warming_up(self, env_steps: int) -> bool:
        """Whether the critic alone learns: until warmup_cycles cycles, warmup_updates updates and
        warmup_steps environment steps have all passed."""
        cfg = self.cfg
        cycle = self.updates // cfg.updates_per_cycle  # cycles completed before this update's
        return cycle < cfg.warmup_cycles or self.updates < cfg.warmup_updates or env_steps < cfg.warmup_steps

    def _critic_update(
        self,
        taken: CandidateBatch,
        following: CandidateBatch | None,
        reward: torch.Tensor,
        discount: torch.Tensor,
        alpha: torch.Tensor,
        env_steps: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """One step on the n-step TD error (eq. 3) of the taken actions."""
        agent = self.agent
        with torch.no_grad():
            next_value = torch.zeros_like(reward)
            if following is not None:
                # A target critic on the policy's own LLM weights reads Q from the pass that gives pi(.|s_{t+n}).
                next_policy, next_pass = agent.policy(following, hidden=agent.critic.reads_policy_pass(target=True))
                next_q = agent.q(following, target=True, policy_pass=next_pass)
                value = torch.where(following.real, soft_state_value(next_policy, next_q, alpha), 0)
                next_value = torch.cat([value, next_value[len(value) :]])
            target = critic_targets(reward, discount, next_value)
        q_taken = agent.q(taken)[:, 0]
        loss = torch.nn.functional.mse_loss(q_taken, target)
        norm = self._step(self.critic_optimizer, self.critic_params, loss)
        self.health.record(env_steps, **{"critic loss": loss, "critic gradient": norm})
        return {"critic_loss": loss.detach(), "mean_q": q_taken.detach().mean()}

    def _actor_update(
        self, current: CandidateBatch, alpha: torch.Tensor, env_steps: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One step on the actor's loss with the (just updated) critic's Q, then one on alpha's."""
        agent = self.agent
        policy, policy_pass = agent.policy(current, hidden=agent.critic.reads_policy_pass())
        with torch.no_grad():  # the actor's loss must not train the critic
            q_all = agent.q(current, policy_pass=policy_pass)
        loss = ACTOR_LOSSES[self.cfg.actor_loss](policy, q_all, alpha)
        norm = self._step(self.actor_optimizer, self.actor_params, loss)
        self.health.record(env_steps, **{"actor loss": loss, "actor gradient": norm})
        stats = {"actor_loss": loss.detach(), "entropy": policy.entropy().detach().mean()}
        stats |= target_statistics(policy, q_all, alpha)
        if self.cfg.autotune_alpha:
            loss = alpha_loss(self.log_alpha, policy, self.cfg.target_entropy)
            norm = self._step(self.alpha_optimizer, [self.log_alpha], loss, False)
            self.health.record(env_steps, **{"alpha loss": loss, "alpha gradient": norm})
        return stats

    def _step(
        self, optimizer: torch.optim.Optimizer, params: list, loss: torch.Tensor, clip: bool = True
    ) -> torch.Tensor:
        """One optimizer step on `loss`; the gradients' norm (the float16 scaler's skipped steps are counted)."""
        for group in (self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer):
            group.zero_grad(set_to_none=True)
        scaler = self.scalers[optimizer]  # a no-op unless the LLM computes in fp16
        scaler.scale(loss).backward()
        self.ranks.average_gradients(params)
        norm, skipped = step(optimizer, scaler, params, self.cfg.max_grad_norm if clip else None)
        self.health.stepped(skipped)
        return norm

    def pop_stats(self) -> dict[str, float]:
        """Means since the last call, with the current alpha and HER share."""
        return self.stats.pop() | self._current_stats()

    def recent_stats(self) -> dict[str, float]:
        """Means since the last call (the monitor's), with the current alpha and HER share (and float16's skipped
        steps); leaves them to `pop_stats`."""
        skipped = {"skipped_steps": float(self.health.skipped)} if self.agent.plan.loss_scaling else {}
        return self.stats.unseen() | self._current_stats() | skipped

    def divergence(self) -> tuple[str, int, int] | None:
        """What first went non-finite in the updates, at which update and environment step (None: nothing)."""
        return self.health.divergence()

    def trained_tensors(self) -> list[torch.Tensor]:
        """Everything a checkpoint keeps that training changes on the device: optimizer states and log alpha."""
        states = [self.actor_optimizer, self.critic_optimizer, self.alpha_optimizer]
        return [
            self.log_alpha,
            *(t for o in states for s in o.state.values() for t in s.values() if t.is_floating_point()),
        ]

    def _current_stats(self) -> dict[str, float]:
        her = sum(b.her_share() for b in self.buffers) / len(self.buffers)  # the mean of the ranks' shares
        return {"alpha": self.alpha, "her_share": her, "updates": self.updates}

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "actor_schedule": self.actor_schedule.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "updates": self.updates,
            "scalers": [scaler.state_dict() for scaler in self.scalers.values()],
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.actor_schedule.load_state_dict(state["actor_schedule"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.updates = state["updates"]
        self.health.start_at(self.updates)
        for scaler, scaler_state in zip(self.scalers.values(), state["scalers"], strict=True):
            scaler.load_state_dict(scaler_state)

    def local_state_dict(self) -> dict:
        """State that differs between processes: the replay buffers of its ranks' environments (and the
        statistics gathered since the last metrics row)."""
        return {"buffers": [b.state_dict() for b in self.buffers], "stats": self.stats.state_dict()}

    def load_local_state_dict(self, state: dict) -> None:
        for buffer, buffer_state in zip(self.buffers, state["buffers"], strict=True):
            buffer.load_state_dict(buffer_state)
        self.stats.load_state_dict(state["stats"])
