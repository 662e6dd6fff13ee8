"""Periodic evaluation: success rates on train goals per goal type and overall, and on the test split.

The evaluation goals are drawn once from a fixed seed, stratified by goal type (uniform sampling would
almost never pick the rare simple goals of the full environment), and the overall train success weights
the per-type rates by the environment's own goal-type distribution. Episodes are shared out among ranks.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from sacglam_core.config import RunConfig
from sacglam_core.envs import EnvConfig, GoalType, PlaygroundText, catalog

if TYPE_CHECKING:  # torch only where the agent acts: the random policy's evaluation runs on a login node
    from sacglam_core.agent import GlamAgent
    from sacglam_core.distributed import Ranks


def goal_type_prior(env: EnvConfig) -> np.ndarray:
    """P(goal type) when goals are drawn uniformly from the environment's train goals (paper Figure 4)."""
    goals = catalog()
    counts = Counter(goals.parse(g).type for g in goals.goals("train", env.simplified))
    return np.array([counts[t] / sum(counts.values()) for t in GoalType])


def metric_name(goal_type: GoalType) -> str:
    return "eval_success_" + goal_type.value.replace(" ", "_")


def success_standard_error(rates: Mapping[str, float], config: RunConfig) -> float:
    """The binomial standard error of one evaluation's `eval_success` (`rates`: its metrics row), the goal-type
    weighted mean of per-type rates over `eval.episodes_per_type` episodes each: sqrt(sum_t p_t^2 r_t(1-r_t) / n)."""
    n = config.eval.episodes_per_type
    variance = 0.0
    for p, goal_type in zip(goal_type_prior(config.env), GoalType):
        rate = rates.get(metric_name(goal_type))
        if p > 0 and rate is not None and math.isfinite(rate):
            variance += p * p * rate * (1 - rate) / n
    return math.sqrt(variance)


def episodes_for_standard_error(env: EnvConfig, at_most: float) -> int:
    """Episodes per goal type for which `eval_success`'s standard error is at most `at_most` whatever the rates
    (the worst case: every type at 0.5)."""
    return math.ceil(float((goal_type_prior(env) ** 2).sum()) * 0.25 / at_most**2)


@cache
def evaluation_goals(simplified: bool, per_type: int, test: int, seed: int) -> tuple[tuple[str, str], ...]:
    """(split, goal) pairs: `per_type` train goals of each type present, and `test` test goals."""
    rng = random.Random(seed)
    goals = catalog()
    chosen: list[tuple[str, str]] = []
    by_type = goals.by_type("train", simplified)
    for goal_type in GoalType:
        if goal_type in by_type:
            chosen += [("train", rng.choice(by_type[goal_type])) for _ in range(per_type)]
    chosen += [("test", g) for g in rng.choices(goals.goals("test", simplified), k=test)]
    return tuple(chosen)


# chooses one candidate per environment: (goals, observations, candidate lists) -> indices
Policy = Callable[[list[str], list[str], list[list[str]]], list[int]]


def agent_policy(agent: GlamAgent, config: RunConfig, round_index: int) -> Policy:
    """The agent as it acts (or greedily, with `eval.greedy`), sampling from a generator of its own."""
    import torch

    generator = torch.Generator().manual_seed(config.eval.seed + round_index)

    def act(goals, observations, candidates):
        return agent.act(goals, observations, candidates, greedy=config.eval.greedy, generator=generator)

    return act


def random_policy(seed: int = 0) -> Policy:
    """The uniform policy over candidates: the baseline a learning agent must beat."""
    rng = random.Random(seed)
    return lambda goals, observations, candidates: [rng.randrange(len(c)) for c in candidates]


def evaluate(
    policy: Callable[[], Policy],
    config: RunConfig,
    ranks: Ranks | None = None,
    plan: tuple[tuple[str, str], ...] | None = None,
) -> dict[str, float]:
    """Success rates on the configuration's evaluation plan (or on `plan`'s (split, goal) pairs), shared out among
    the data-parallel `ranks` (None: this process alone), each rank's episodes played by a fresh `policy()`."""
    cfg = config.eval
    plan = plan or evaluation_goals(config.env.simplified, cfg.episodes_per_type, cfg.test_episodes, cfg.seed)
    keys = [("test", None)] + [("train", t) for t in GoalType]
    totals = [0.0] * (2 * len(keys))
    goals = catalog()
    for rank in ranks.held if ranks else [0]:
        mine = [(i, split, goal) for i, (split, goal) in enumerate(plan) if i % (ranks.total if ranks else 1) == rank]
        for (_, split, goal), s in zip(mine, _play(policy(), config, mine)):
            k = keys.index(("test", None) if split == "test" else ("train", goals.parse(goal).type))
            totals[2 * k] += s
            totals[2 * k + 1] += 1
    totals = ranks.sum(totals) if ranks else totals  # successes and counts per (split, type) over the processes
    rates = {k: totals[2 * i] / totals[2 * i + 1] for i, k in enumerate(keys) if totals[2 * i + 1]}
    prior = goal_type_prior(config.env)
    metrics = {metric_name(t): rates[("train", t)] for t in GoalType if ("train", t) in rates}
    metrics["eval_success"] = float(sum(p * rates.get(("train", t), 0.0) for p, t in zip(prior, GoalType)))
    if ("test", None) in rates:
        metrics["eval_success_test"] = rates[("test", None)]
    return metrics


def evaluate_rounds(agent: GlamAgent, config: RunConfig, ranks: Ranks, first_round: int, rounds: int) -> dict:
    """The success rates' mean over `rounds` evaluations, the first numbered `first_round` (each round its own random
    numbers), and with several rounds `eval_success_se`, the standard error of that mean."""
    results = [
        evaluate(lambda r=r: agent_policy(agent, config, r), config, ranks)
        for r in range(first_round, first_round + rounds)
    ]
    metrics = {key: float(np.mean([r[key] for r in results])) for key in results[0]}
    if rounds > 1:
        metrics["eval_success_se"] = float(np.std([r["eval_success"] for r in results], ddof=1) / np.sqrt(rounds))
    return metrics


def _play(policy: Policy, config: RunConfig, episodes: list[tuple[int, str, str]]) -> list[float]:
    """The success of each episode (its index in the plan, split and goal), all played together by `policy`."""
    envs = [PlaygroundText(config.env, seed=config.eval.seed + 7919 * i) for i, _, _ in episodes]
    obs, infos = (
        map(list, zip(*(env.reset(options={"goal": g}) for env, (_, _, g) in zip(envs, episodes))))
        if episodes
        else ([], [])
    )
    success = [0.0] * len(episodes)
    active = list(range(len(episodes)))
    while active:
        goals = [infos[i]["goal"] for i in active]
        candidates = [infos[i]["possible_actions"] for i in active]
        choices = policy(goals, [obs[i] for i in active], candidates)
        still = []
        for i, choice in zip(active, choices):
            obs[i], reward, terminated, truncated, infos[i] = envs[i].step(infos[i]["possible_actions"][choice])
            success[i] = max(success[i], reward)
            if not (terminated or truncated):
                still.append(i)
        active = still
    return success
