"""Each loss and target on tiny hand-computed cases, HER relabelling and the batch-sampling shares."""

import math

import numpy as np
import pytest
import torch

from sacglam_core.agent import CandidateDistribution
from sacglam_core.algos.ppo import clipped_surrogate, gae, kl_penalised, ppo_objective, value_loss
from sacglam_core.algos.sac import (
    actor_loss,
    alpha_loss,
    critic_targets,
    forward_kl_actor_loss,
    soft_state_value,
    target_statistics,
)
from sacglam_core.config import PPOConfig
from sacglam_core.envs import GoalType
from sacglam_core.replay import ReplayBuffer
from sacglam_core.trajectories import Episode, goal_id, goal_table, n_step_targets, relabelled


def dist(probs: list[list[float]]) -> CandidateDistribution:
    """Rows may be shorter than the widest one: missing entries are absent candidates."""
    width = max(map(len, probs))
    mask = torch.tensor([[j < len(p) for j in range(width)] for p in probs])
    logp = torch.tensor([[math.log(p[j]) if j < len(p) else 0.0 for j in range(width)] for p in probs])
    return CandidateDistribution(logp, mask)


def test_n_step_targets_terminal_and_time_limit():
    returns, bootstrap, discount = n_step_targets([0.0, 0.0, 1.0], terminated=True, n=2, gamma=0.5)
    np.testing.assert_allclose(returns, [0.0, 0.5, 1.0])
    assert bootstrap.tolist() == [2, 3, 3]
    np.testing.assert_allclose(discount, [0.25, 0.0, 0.0])
    returns, bootstrap, discount = n_step_targets([0.0, 0.0, 0.0], terminated=False, n=2, gamma=0.5)
    np.testing.assert_allclose(returns, [0.0, 0.0, 0.0])
    assert bootstrap.tolist() == [2, 3, 3]
    np.testing.assert_allclose(discount, [0.25, 0.25, 0.5])  # a time limit is not terminal: bootstrap
    returns, _, discount = n_step_targets([0.0, 1.0], terminated=True, n=1, gamma=0.9)
    np.testing.assert_allclose(returns, [0.0, 1.0])
    np.testing.assert_allclose(discount, [0.9, 0.0])


def test_soft_value_and_critic_target():
    policy = dist([[0.25, 0.75], [1.0]])
    q = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    alpha = 0.1
    expected_v0 = 0.25 * (1.0 - alpha * math.log(0.25)) + 0.75 * (2.0 - alpha * math.log(0.75))
    v = soft_state_value(policy, q, alpha)
    torch.testing.assert_close(v, torch.tensor([expected_v0, 3.0]))
    y = critic_targets(torch.tensor([0.5, 1.0]), torch.tensor([0.99**3, 0.0]), v)
    torch.testing.assert_close(y, torch.tensor([0.5 + 0.99**3 * expected_v0, 1.0]))


def test_actor_loss_is_the_expectation_over_candidates():
    policy = dist([[0.5, 0.5], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    alpha = 0.5
    row0 = 0.5 * (alpha * math.log(0.5) - 1.0) + 0.5 * (alpha * math.log(0.5) - 0.0)
    row1 = 0.2 * (alpha * math.log(0.2)) + 0.3 * (alpha * math.log(0.3) - 1.0) + 0.5 * (alpha * math.log(0.5) - 2.0)
    torch.testing.assert_close(actor_loss(policy, q, alpha), torch.tensor((row0 + row1) / 2))


def test_the_actors_target_is_the_boltzmann_policy_of_q_over_the_candidates_present():
    policy = dist([[0.5, 0.5], [0.2, 0.3, 0.5]])  # the first state has two candidates: its third Q must not count
    q = torch.tensor([[1.0, 0.0, 9.0], [0.0, 1.0, 2.0]])
    stats = target_statistics(policy, q, 0.5)
    p0 = torch.softmax(torch.tensor([2.0, 0.0]), 0)
    p1 = torch.softmax(torch.tensor([0.0, 2.0, 4.0]), 0)
    entropy = -((p0 * p0.log()).sum() + (p1 * p1.log()).sum()) / 2
    torch.testing.assert_close(stats["target_policy_entropy"], entropy)
    torch.testing.assert_close(stats["q_range"], torch.tensor((1.0 + 2.0) / 2))


def test_actor_gradient_moves_probability_to_the_best_candidate():
    logits = torch.zeros(1, 3, requires_grad=True)
    policy = CandidateDistribution(torch.log_softmax(logits, 1), torch.ones(1, 3, dtype=torch.bool))
    actor_loss(policy, torch.tensor([[0.0, 1.0, 0.0]]), 0.01).backward()
    assert logits.grad[0, 1] < 0 < logits.grad[0, 0]  # descent raises the best candidate


def test_the_forward_kl_actor_loss_pulls_a_saturated_policy_back_where_the_papers_barely_moves_it():
    """On logits z of a policy that is one-hot on a candidate the critic ranks only slightly above another, the
    forward loss's gradient is pi - softmax(Q / alpha) (the third candidate is absent and gets none); the
    reverse (paper's) loss's gradient, proportional to pi, is almost 0."""
    q, alpha = torch.tensor([[1.0, 0.9, 5.0]]), 0.1
    mask = torch.tensor([[True, True, False]])
    gradients = {}
    for loss in (actor_loss, forward_kl_actor_loss):
        logits = torch.tensor([[12.0, 0.0, 0.0]], requires_grad=True)
        log_probs = torch.log_softmax(logits.masked_fill(~mask, -math.inf), 1).masked_fill(~mask, 0.0)
        loss(CandidateDistribution(log_probs, mask), q, alpha).backward()
        gradients[loss] = logits.grad[0]
    pi = torch.softmax(torch.tensor([12.0, 0.0]), 0)
    target = torch.softmax(torch.tensor([10.0, 9.0]), 0)  # Q / alpha over the two candidates present
    torch.testing.assert_close(gradients[forward_kl_actor_loss], torch.cat([pi - target, torch.zeros(1)]))
    assert gradients[forward_kl_actor_loss][1] < -0.2  # raises the second candidate towards its 0.27
    assert gradients[actor_loss].abs().max() < 1e-4


@pytest.mark.parametrize("entropy_target, alpha_rises", [(2.0, True), (0.0, False)])
def test_alpha_loss_sign(entropy_target, alpha_rises):
    policy = dist([[0.5, 0.5]])  # entropy log 2 = 0.69 nats
    log_alpha = torch.tensor(math.log(0.05), requires_grad=True)
    loss = alpha_loss(log_alpha, policy, entropy_target)
    expected = -0.05 * (-math.log(2) + entropy_target)
    torch.testing.assert_close(loss, torch.tensor(expected))
    loss.backward()
    assert (log_alpha.grad < 0) == alpha_rises  # gradient descent moves against the gradient


def test_gae_hand_computed():
    rewards, values = np.array([0.0, 1.0]), np.array([0.5, 0.8])
    advantages, returns = gae(rewards, values, last_value=0.5, terminal=True, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(advantages, [0.22 + 0.72 * 0.2, 0.2], rtol=1e-6)
    np.testing.assert_allclose(returns, advantages + values, rtol=1e-6)
    advantages, _ = gae(rewards, values, last_value=0.5, terminal=False, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(advantages, [0.22 + 0.72 * 0.65, 0.65], rtol=1e-6)


def test_clipped_and_kl_surrogates():
    one = torch.tensor([1.0])
    ratio = torch.tensor([1.5, 0.5])
    advantages = torch.tensor([1.0, -1.0])
    # min(1.5, 1.2) * 1 = 1.2 -> -1.2 ; for A<0: max(0.5, 0.8) = 0.8
    torch.testing.assert_close(
        clipped_surrogate(ratio, advantages, one * 0.8, one * 1.2), torch.tensor((-1.2 + 0.8) / 2)
    )
    # centred at r0 = 2: a ratio of 2.1 is inside [1.8, 2.2], so nothing is clipped
    torch.testing.assert_close(clipped_surrogate(torch.tensor([2.1]), one, one * 1.8, one * 2.2), torch.tensor(-2.1))
    torch.testing.assert_close(kl_penalised(one, 2 * one, torch.tensor([0.5]), beta=0.1), torch.tensor(-2.0 + 0.05))


def test_value_loss_clipped_as_glam_and_plain():
    """GLAM's PPOUpdater: max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), averaged."""
    values, old, returns = torch.tensor([1.0, 0.6, 0.1]), torch.tensor([0.5, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    # row 0: V moved up by 0.5, clipped to 0.7: max(1.0, 0.49) = 1.0
    # row 1: V moved up by 0.6 towards R, clipped to 0.2: max(0.16, 0.64) = 0.64 (no credit beyond the clip)
    # row 2: inside the clip: both are 0.01
    torch.testing.assert_close(value_loss(values, old, returns, clip=0.2), torch.tensor((1.0 + 0.64 + 0.01) / 3))
    torch.testing.assert_close(value_loss(values, old, returns, clip=None), torch.tensor((1.0 + 0.16 + 0.01) / 3))
    torch.testing.assert_close(value_loss(values, values, returns, clip=0.2), value_loss(values, old, returns, None))


def test_ppo_objective_weighs_the_value_loss_by_table_1s_coefficient():
    """L = L_pi - c_H H + c_V L_V with c_V = 0.5 on L_V itself (GLAM), not 0.5 * 0.5 * MSE."""
    objective = ppo_objective(
        torch.tensor(0.3), torch.tensor(2.0), torch.tensor(1.0), entropy_coef=0.01, value_coef=0.5
    )
    torch.testing.assert_close(objective, torch.tensor(0.3 - 0.02 + 0.5))


def test_ppo_defaults_follow_glam():
    """GLAM: the clipped value loss with the policy's clip radius, and raw GAE advantages (no normalisation)."""
    config = PPOConfig()
    assert config.value_loss == "clipped" and config.normalize_advantages is False and config.value_coef == 0.5


def episode(goal: str, reports: list[list[str]], terminated: bool = False) -> Episode:
    steps = len(reports)
    return Episode(
        goal=goal,
        observations=[np.array([t, t]) for t in range(steps + 1)],
        candidates=[np.array([0, 1], np.int16) for _ in range(steps + 1)],
        actions=[t % 2 for t in range(steps)],
        rewards=[0.0] * (steps - 1) + [float(terminated)],
        reports=reports,
        terminated=terminated,
        extras={"logp": [-0.1 * t for t in range(steps)]},
    )


def test_her_relabels_each_reported_goal_up_to_its_step():
    ep = episode(
        "Grasp blue lion",
        [[], ["Grasp any water", "Grasp any supply"], [], ["Grow red dog", "Grasp blue lion"]],
        terminated=True,
    )
    copies = relabelled(ep)
    assert [(c.goal, c.length) for c in copies] == [
        ("Grasp any water", 2),
        ("Grasp any supply", 2),
        ("Grow red dog", 4),
    ]
    water = copies[0]
    assert water.rewards == [0.0, 1.0] and water.terminated
    assert len(water.observations) == 3 and water.extras["logp"] == [0.0, -0.1]
    assert water.observations[0] is ep.observations[0]  # shared, not copied


def test_her_aligned_only_keeps_sub_goals():
    ep = episode(
        "Grow red dog then grasp blue cat",
        [["Grasp any food", "Grasp blue tree"], ["Grow any animal", "Grow blue cat"]],
    )
    assert [c.goal for c in relabelled(ep, aligned_only=True)] == ["Grasp any food", "Grow any animal"]


def fill(buffer: ReplayBuffer, goal: str, her: bool, episodes: int) -> None:
    for _ in range(episodes):
        buffer.add_episode(episode(goal, [[]] * 5), her=her)


def test_sampling_shares():
    prior = np.array([0.1, 0.2, 0.3, 0.4])  # grasp, grow, grow then grasp, grow then grow
    buffer = ReplayBuffer(10_000, 3, 0.99, prior, seed=0)
    fill(buffer, "Grasp red dog", her=False, episodes=200)  # 1000 env transitions, all Grasp
    fill(buffer, "Grow red dog", her=True, episodes=300)  # 1500 HER, Grow
    fill(buffer, "Grow red dog then grasp blue cat", her=True, episodes=150)  # 750 HER, grow then grasp
    assert buffer.her_share() == pytest.approx(2250 / 3250)
    her = buffer.data["her"]
    types = buffer.data["goal_type"]

    rows = buffer.sample(256, "ratio", her_fraction=0.5)
    assert her[rows].sum() == 128
    rows = buffer.sample(256, "ratio", her_fraction=0.25)
    assert her[rows].sum() == 64
    rows = np.concatenate([buffer.sample(256, "uniform") for _ in range(40)])
    assert her[rows].mean() == pytest.approx(2250 / 3250, abs=0.02)
    rows = np.concatenate([buffer.sample(256, "prior") for _ in range(40)])
    present = prior[:3] / prior[:3].sum()  # no grow-then-grow data: renormalised over what is there
    shares = np.bincount(types[rows], minlength=4)[:3] / len(rows)
    np.testing.assert_allclose(shares, present, atol=0.02)
    rows = np.concatenate([buffer.sample(256, "prior_ratio") for _ in range(40)])
    assert her[rows].mean() == pytest.approx(0.5)
    her_types = np.bincount(types[rows][her[rows]], minlength=4)[1:3]
    np.testing.assert_allclose(her_types / her_types.sum(), [0.4, 0.6], atol=0.03)  # prior 0.2 : 0.3 within HER
    with pytest.raises(ValueError, match="strategy"):
        buffer.sample(8, "nearest")


def test_ratio_falls_back_when_a_pool_is_empty():
    buffer = ReplayBuffer(100, 1, 0.99, np.ones(4) / 4, seed=0)
    fill(buffer, "Grasp red dog", her=False, episodes=4)
    assert not buffer.data["her"][buffer.sample(32, "ratio")].any()


def test_goal_table_types():
    texts, index, types = goal_table()
    assert len(texts) == 8470 + 3145
    assert GoalType(list(GoalType)[types[goal_id("Grow red dog then grasp blue cat")]]) == GoalType.GROW_THEN_GRASP
    assert texts[index["Grasp any red thing"]] == "Grasp any red thing"


def test_buffer_of_100k_transitions_is_compact():
    """Token ids, not strings: 100,000 realistic transitions stay well under 100 MB in memory and on disk."""
    import io

    buffer = ReplayBuffer(100_000, 3, 0.99, np.ones(4) / 4, seed=0)
    rng = np.random.default_rng(0)
    template = episode("Grow red dog then grasp blue cat", [[]] * 20)
    template.observations = [rng.integers(0, 32_000, size=60) for _ in range(21)]  # Flan-T5-sized prompts
    template.candidates = [rng.integers(0, 194, size=9).astype(np.int16) for _ in range(21)]
    for _ in range(5000):
        buffer.add_episode(template, her=False)
    assert len(buffer) == 100_000
    in_memory = sum(a.nbytes for a in buffer.data.values())
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    assert in_memory < 100e6 and saved.tell() < 100e6, (in_memory, saved.tell())
