"""The agent judged against the environment's planner, on held-out states: does the critic rank actions better than
the prior does, and is the gap it must resolve larger than what the entropy term adds?

States come from random play on train goals, from a seed of their own (no run trains or evaluates on them). Each is
labelled by the planner (envs/planner.py): for every candidate, the discounted return of taking it and then
following the planner to the goal, the horizon left aside as training bootstraps truncated episodes. At each
evaluation the trainer measures, over these states:

- `planner_policy_share`: the share where the policy's most likely action is a best one (of the highest return;
  `planner_chance_share`: a uniform choice's, about a fifth);
- `planner_q_share` (SAC): the share where argmax Q is a best one;
- `planner_q_gap` (SAC): the planner's action's Q less the mean Q of the other candidates,
- `planner_true_gap`: the same gap in the planner's returns: what the critic has to resolve,
- `planner_alpha_logp_gap` (SAC): alpha times the same gap in log pi: what the entropy term adds to the actor's
  target at that scale.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np
import torch

from sacglam_core.config import RunConfig
from sacglam_core.envs import PlaygroundText, catalog
from sacglam_core.envs.planner import planner_action

SEED_OFFSET = 424_242  # the probe's own states: a seed away from the evaluation's and the runs'
LOOKAHEAD = 64  # the planner's steps after a candidate before a state counts as unsolved


@dataclass(frozen=True)
class ProbeStates:
    goals: list[str]
    observations: list[str]
    candidates: list[list[str]]
    planner: np.ndarray  # [N] the index of the planner's action among each state's candidates
    returns: list[np.ndarray]  # per state, per candidate: the discounted return of it, then the planner


def planner_return(env: PlaygroundText, action: str, gamma: float) -> float:
    """The discounted return of `action` in `env`'s state, then the planner's actions until the goal (0 if it is not
    reached within LOOKAHEAD steps); `env` is left as it was."""
    copy = PlaygroundText(dataclasses.replace(env.config, max_steps=10**9))  # no horizon: training bootstraps it
    copy.load_state_dict(env.state_dict())
    _, reward, terminated, _, _ = copy.step(action)
    for k in range(LOOKAHEAD + 1):
        if terminated:
            return float(reward) * gamma**k
        if k < LOOKAHEAD:
            _, reward, terminated, _, _ = copy.step(planner_action(copy))
    return 0.0


def probe_states(config: RunConfig, count: int) -> ProbeStates:
    """`count` states of random play from train goals of every goal type in turn, not terminal, each labelled."""
    seed = config.eval.seed + SEED_OFFSET
    rng = random.Random(seed)
    by_type = catalog().by_type("train", config.env.simplified)
    gamma = config.sac.gamma if config.algorithm == "sac" else config.ppo.gamma
    goals, observations, candidates, planner, returns = [], [], [], [], []
    for i in range(count):
        env = PlaygroundText(config.env, seed=seed + i)
        obs, info = env.reset(options={"goal": rng.choice(by_type[list(by_type)[i % len(by_type)]])})
        for _ in range(rng.randrange(config.env.max_steps)):
            before = env.state_dict()
            next_obs, _, terminated, truncated, next_info = env.step(rng.choice(info["possible_actions"]))
            if terminated or truncated:  # keep the last state before the episode's end
                env.load_state_dict(before)
                break
            obs, info = next_obs, next_info
        actions = list(info["possible_actions"])
        goals.append(env.goal.text)
        observations.append(obs)
        candidates.append(actions)
        planner.append(actions.index(planner_action(env)))
        returns.append(np.array([planner_return(env, a, gamma) for a in actions]))
    return ProbeStates(goals, observations, candidates, np.array(planner), returns)


def agreement(
    states: ProbeStates, log_probs: np.ndarray, q: np.ndarray | None = None, alpha: float | None = None
) -> dict[str, float]:
    """The measures of the module's docstring from the policy's log-probabilities and Q (SAC), both [N, slots] with
    each state's candidates first."""
    policy_best, q_best, q_gap, true_gap, alpha_gap = [], [], [], [], []
    for i, returns in enumerate(states.returns):
        n, planner = len(returns), states.planner[i]
        best = returns >= returns.max() - 1e-9
        policy_best.append(best[int(np.argmax(log_probs[i, :n]))])
        others = np.arange(n) != planner
        if others.any():
            true_gap.append(returns[planner] - returns[others].mean())
        if q is not None:
            q_best.append(best[int(np.argmax(q[i, :n]))])
            if others.any():
                q_gap.append(q[i, planner] - q[i, :n][others].mean())
                alpha_gap.append(alpha * (log_probs[i, planner] - log_probs[i, :n][others].mean()))
    chance = np.mean([(r >= r.max() - 1e-9).mean() for r in states.returns])  # a uniform choice's share
    out = {
        "planner_policy_share": float(np.mean(policy_best)),
        "planner_chance_share": float(chance),
        "planner_true_gap": float(np.mean(true_gap)),
    }
    if q is not None:
        out |= {
            "planner_q_share": float(np.mean(q_best)),
            "planner_q_gap": float(np.mean(q_gap)),
            "planner_alpha_logp_gap": float(np.mean(alpha_gap)),
        }
    return out


@torch.no_grad()
def measure(agent, states: ProbeStates, alpha: float | None = None, chunk: int = 64) -> dict[str, float]:
    """The agent's measures on the probe's states: its policy's, and its critic's where it has one. Static shapes'
    widths only grow (agent/batch.py): the probe's batches leave them as training had them, so that it changes no
    later batch."""
    widest = dict(agent.lm.shapes.widest)
    try:
        return _measure(agent, states, alpha, chunk)
    finally:
        agent.lm.shapes.widest.clear()
        agent.lm.shapes.widest.update(widest)


def _measure(agent, states: ProbeStates, alpha: float | None, chunk: int) -> dict[str, float]:
    log_probs, q_values = [], []
    for start in range(0, len(states.goals), chunk):
        rows = slice(start, start + chunk)
        batch = agent.batch(states.goals[rows], states.observations[rows], states.candidates[rows])
        critic = agent.critic is not None
        policy, policy_pass = agent.policy(batch, hidden=critic and agent.critic.reads_policy_pass())
        log_probs.append(policy.log_probs.float().cpu().numpy())
        if critic:
            q_values.append(agent.q(batch, policy_pass=policy_pass).float().cpu().numpy())
    width = max(a.shape[1] for a in log_probs)

    def stacked(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-np.inf) for p in parts])

    return agreement(states, stacked(log_probs), stacked(q_values) if q_values else None, alpha)
