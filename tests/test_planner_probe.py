"""The critic and the policy judged against the environment's planner (planner_probe.py), and the firmer start."""

import json
import math

import numpy as np
import pytest

from sacglam_core.config import parse_config
from sacglam_core.envs import PlaygroundText
from sacglam_core.planner_probe import agreement, planner_return, probe_states
from tests.test_train import SAC_HER, rows, train
from tests.tiny_runs import write_config

DEMO_ENV = {"simplified": True, "n_objects": 6, "max_steps": 7}


@pytest.fixture(scope="module")
def states():
    config = parse_config({"algorithm": "sac", "model": {"name_or_path": "x"}, "env": DEMO_ENV, "num_envs": 32})
    return probe_states(config, 128)


def padded(values: list[np.ndarray], fill: float = -np.inf) -> np.ndarray:
    out = np.full((len(values), max(map(len, values))), fill)
    for i, v in enumerate(values):
        out[i, : len(v)] = v
    return out


def test_a_critic_given_the_planners_values_scores_one_and_a_reversed_one_does_not(states):
    q = padded(states.returns)
    sharp = padded([np.log(np.exp(200 * r) / np.exp(200 * r).sum()) for r in states.returns])  # pi = softmax(Q / 0.005)
    measured = agreement(states, sharp, q, alpha=0.005)
    assert measured["planner_q_share"] == 1.0 and measured["planner_policy_share"] == 1.0
    assert measured["planner_q_gap"] == pytest.approx(measured["planner_true_gap"])
    assert 0.005 < measured["planner_true_gap"] < 0.05  # gamma 0.99: a wasted step costs about 1% of the return
    reversed_ = agreement(states, -sharp, padded([-r for r in states.returns], np.inf), alpha=0.005)
    assert reversed_["planner_q_share"] < 0.5 and reversed_["planner_policy_share"] < 0.5
    assert reversed_["planner_q_gap"] < 0


def test_probe_states_are_reproducible_live_states_the_planner_solves(states):
    config = parse_config({"algorithm": "sac", "model": {"name_or_path": "x"}, "env": DEMO_ENV, "num_envs": 32})
    again = probe_states(config, 128)
    assert again.observations == states.observations and all(map(np.array_equal, again.returns, states.returns))
    gamma = config.sac.gamma
    for returns, planner in zip(states.returns, states.planner):
        steps = math.log(returns[planner]) / math.log(gamma)  # the planner's action reaches the goal in steps + 1
        assert returns[planner] > 0 and steps == pytest.approx(round(steps))
    assert len({g for g in states.goals}) > 10 and min(map(len, states.candidates)) >= 2
    env = PlaygroundText(config.env, seed=1)
    env.reset()
    before = env.state_dict()
    planner_return(env, env._info([])["possible_actions"][0], gamma)  # noqa: SLF001
    assert env.state_dict() == before  # the lookahead plays on a copy


def test_every_metrics_row_judges_the_agent_against_the_planner_and_the_start_is_a_mean_of_rounds(
    tmp_path, tiny_models
):
    config = write_config(tmp_path / "run.yaml", tiny_models["tiny-t5"], total_steps=128, eval={"start_rounds": 3},
                          **SAC_HER)  # fmt: skip
    train(config)
    table = rows(tmp_path / "out")
    for row in table:
        shares = [float(row[k]) for k in ("planner_policy_share", "planner_q_share")]
        assert all(0 <= s <= 1 for s in shares) and float(row["planner_true_gap"]) > 0
        assert all(row[k] != "" for k in ("planner_q_gap", "planner_alpha_logp_gap"))
    assert float(table[0]["eval_success_se"]) >= 0 and all(r["eval_success_se"] == "" for r in table[1:])
    single = write_config(tmp_path / "one.yaml", tiny_models["tiny-t5"], total_steps=128, **SAC_HER)
    single.write_text(single.read_text().replace(str(tmp_path / "out"), str(tmp_path / "single")))
    train(single)
    first = rows(tmp_path / "single")[0]
    assert first["eval_success_se"] == "" and first["planner_policy_share"] == table[0]["planner_policy_share"]
    assert (
        json.loads((tmp_path / "out" / "done.json").read_text())["fingerprint"]
        != json.loads((tmp_path / "single" / "done.json").read_text())["fingerprint"]
    )  # three rounds at the start are another configuration


def test_probing_leaves_the_static_widths_that_later_batches_are_padded_to(tiny_models, states):
    """Static shapes' widths only grow: a probe that widened them would change every later update's padding."""
    from sacglam_core.agent import AgentConfig, GlamAgent
    from sacglam_core.config import CriticConfig, ModelConfig
    from sacglam_core.envs.playground import ACTION_VOCABULARY
    from sacglam_core.planner_probe import measure

    model = ModelConfig(str(tiny_models["tiny-t5"]), lora={"r": 4}, static_shapes=True)
    agent = GlamAgent.from_config(AgentConfig(model, CriticConfig(), max_candidates=40), ACTION_VOCABULARY)
    agent.batch(states.goals[:1], states.observations[:1], states.candidates[:1])  # a short batch: narrow widths
    before = dict(agent.lm.shapes.widest)
    measured = measure(agent, states, alpha=0.005)
    assert agent.lm.shapes.widest == before and 0 <= measured["planner_q_share"] <= 1
    assert 0.1 < measured["planner_chance_share"] < 0.4
