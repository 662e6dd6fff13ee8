"""SAC's update as it was before its LLM passes were shared and skipped (issue 14): what `SAC._update`
computes, without its savings.

pi(.|s_{t+n}) and the target Q at s_{t+n} go through the LLM for every row (also the rows whose n steps
end the episode, whose target ignores them), each in a pass of its own; then Q of the taken action; then
pi(.|s_t) after the critic's step, with Q(s_t, .) read from that pass when the critic shares it. The
actor's half is unchanged. tests/test_sac_update.py checks that training with either gives the same
numbers, and benchmarks/step_cost.py counts what the savings save.
"""

from __future__ import annotations

import torch

from sacglam_core.algos.sac import SAC, critic_targets, soft_state_value
from sacglam_core.trajectories import goal_table


def reference_batches(sac: SAC, index) -> tuple:
    """(taken, current, following, rows) with s_{t+n} for every row."""
    agent, tokens, ids = sac.agent, sac.agent.tokens, sac._action_tokens
    rows = sac.buffer.rows(index)
    goals = [tokens.goal(goal_table()[0][g]) for g in rows["goal"]]
    prompts = [tokens.join(g, o) for g, o in zip(goals, rows["obs"])]
    taken_index = [[c[a]] for c, a in zip(rows["candidates"], rows["action"])]
    taken = agent.batch_from_ids(prompts, [[ids[i[0]]] for i in taken_index], taken_index)
    current = agent.batch_from_ids(prompts, [[ids[a] for a in c] for c in rows["candidates"]], rows["candidates"])
    following = agent.batch_from_ids(
        [tokens.join(g, o) for g, o in zip(goals, rows["next_obs"])],
        [[ids[a] for a in c] for c in rows["next_candidates"]],
        rows["next_candidates"],
    )
    return taken, current, following, rows


def reference_critic_update(sac: SAC, taken, following, rows, alpha: torch.Tensor) -> None:
    agent, device = sac.agent, sac.agent.lm.device
    with torch.no_grad():
        next_policy, _ = agent.policy(following)
        next_q = agent.q(following, target=True)
        target = critic_targets(
            torch.as_tensor(rows["reward"], device=device),
            torch.as_tensor(rows["discount"], device=device),
            soft_state_value(next_policy, next_q, alpha),
        )
    q_taken = agent.q(taken)[:, 0]
    loss = torch.nn.functional.mse_loss(q_taken, target)
    sac._step(sac.critic_optimizer, sac.critic_params, loss)
    sac.stats.add(critic_loss=loss, mean_q=q_taken.mean())


def reference_update(sac: SAC, env_steps: int) -> None:
    """A drop-in for `SAC._update` (bind it to an instance)."""
    her = sac.config.her
    index = sac.buffer.sample(sac.batch_size, her.sampling if her.enabled else "uniform", her.her_fraction)
    taken, current, following, rows = reference_batches(sac, index)
    alpha = sac.log_alpha.exp().detach()
    reference_critic_update(sac, taken, following, rows, alpha)
    if not sac.warming_up(env_steps):
        sac._actor_update(current, alpha)  # unchanged
    sac.agent.critic.update_target(sac.agent.lm)
    sac.updates += 1
