"""A model's zero-shot policy on a task, before any RL (`python -m sacglam_core.pipeline.prior` checks it against
the targets fixed in workflow/config/prior_targets.yaml, on an experiment's task).

Per goal type, on train goals and on test goals: the random policy's success, the model's sampled and greedy
success (`episodes_per_type` episodes per type and split), its entropy relative to the uniform policy over the
candidates, and its goal sensitivity: the total variation between its policies for the same observation under
the state's goal and under another goal of the same split (0 for a policy blind to goals). A split's overall
success weights its types by the train goals' type distribution, so that train and test compare like with like
(the test goals are mostly Grow goals, the train goals mostly Grasp ones).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.config import RunConfig
from sacglam_core.distributed import Ranks
from sacglam_core.envs import GoalType, PlaygroundText, catalog
from sacglam_core.evaluation import agent_policy, evaluate, metric_name, random_policy

ON_NOTHING = "You are on: nothing"  # the observation line of an agent that stands on no object (envs/playground.py)


@dataclass(frozen=True)
class State:
    goal: str
    observation: str
    candidates: list[str]


def random_play_states(config: RunConfig, split: str, count: int, seed: int) -> list[State]:
    """States reached by the random policy from goals of `split`, as many from each goal type."""
    rng = random.Random(seed)
    by_type = catalog().by_type(split, config.env.simplified)
    states = []
    for i in range(count):
        goal = rng.choice(by_type[list(by_type)[i % len(by_type)]])
        env = PlaygroundText(config.env, seed=seed + i)
        obs, info = env.reset(options={"goal": goal})
        for _ in range(rng.randrange(config.env.max_steps)):
            next_obs, _, terminated, truncated, next_info = env.step(rng.choice(info["possible_actions"]))
            if terminated or truncated:
                break
            obs, info = next_obs, next_info
        states.append(State(goal, obs, list(info["possible_actions"])))
    return states


@torch.no_grad()
def policy_measures(
    agent: GlamAgent, states: list[State], pool: list[str], seed: int
) -> list[tuple[float, float, float]]:
    """Per state: entropy / log(candidates), the total variation to the policy under another goal of `pool`, and the
    probability of `Grasp` (the one one-token action, which an LM that cannot read the state favours)."""
    rng = random.Random(seed)
    others = [rng.choice([g for g in rng.sample(pool, 2) if g != s.goal]) for s in states]
    measures = []
    for start in range(0, len(states), 64):
        chunk, swapped = states[start : start + 64], others[start : start + 64]
        obs, candidates = [s.observation for s in chunk], [s.candidates for s in chunk]
        policy, _ = agent.policy(agent.batch([s.goal for s in chunk], obs, candidates))
        other, _ = agent.policy(agent.batch(swapped, obs, candidates))
        tv = 0.5 * (policy.probs - other.probs).abs().sum(1)
        counts = policy.mask.sum(1).float()
        ratio = (policy.entropy() / counts.log().clamp_min(1e-9)).where(counts > 1, torch.ones_like(counts))
        grasp = [float(p[c.index("Grasp")]) if "Grasp" in c else 0.0 for p, c in zip(policy.probs, candidates)]
        measures += list(zip(ratio.tolist(), tv.tolist(), grasp))
    return measures


def stratified_plan(config: RunConfig, split: str, per_type: int) -> tuple[tuple[str, str], ...]:
    """`per_type` goals of each type of `split`, labelled `train` so that `evaluate` reports them per type."""
    rng = random.Random(config.eval.seed)
    by_type = catalog().by_type(split, config.env.simplified)
    return tuple(("train", rng.choice(by_type[t])) for t in GoalType if t in by_type for _ in range(per_type))


def measure(config: RunConfig, states: int) -> dict[str, dict[str, float]]:
    """Per row (`<split> <goal type>` and `<split>` overall): random, sampled and greedy success, entropy ratio and
    goal sensitivity of `config`'s model on its task, `eval.episodes_per_type` episodes per goal type and split."""
    episodes_per_type = config.eval.episodes_per_type
    greedy = replace(config, eval=replace(config.eval, greedy=True))
    agent = GlamAgent.from_config(AgentConfig(config.model, max_candidates=config.env.max_candidates))
    goals = catalog()
    rows: dict[str, dict[str, float]] = {}
    for split in ("train", "test"):
        plan = stratified_plan(config, split, episodes_per_type)
        success = {
            "random": evaluate(lambda: random_policy(config.eval.seed), config, Ranks(), plan),
            "sampled": evaluate(lambda: agent_policy(agent, config, 0), config, Ranks(), plan),
            "greedy": evaluate(lambda: agent_policy(agent, greedy, 0), config, Ranks(), plan),
        }
        seen = random_play_states(config, split, states, seed=config.eval.seed + (split == "test"))
        per_state = policy_measures(agent, seen, goals.goals(split, config.env.simplified), config.eval.seed)
        groups: dict[str, list[int]] = {split: list(range(len(seen)))}
        for i, state in enumerate(seen):
            groups.setdefault(f"{split} {goals.parse(state.goal).type.value}", []).append(i)
        for row, members in groups.items():
            key = "eval_success" if row == split else metric_name(GoalType(row.split(" ", 1)[1]))
            rows[row] = {name: result[key] for name, result in success.items()}
            rows[row]["entropy_ratio"] = sum(per_state[i][0] for i in members) / len(members)
            rows[row]["goal_sensitivity"] = sum(per_state[i][1] for i in members) / len(members)
            rows[row]["grasp"] = sum(per_state[i][2] for i in members) / len(members)
            empty = [i for i in members if ON_NOTHING in seen[i].observation]
            rows[row]["grasp_on_nothing"] = sum(per_state[i][2] for i in empty) / len(empty) if empty else math.nan
    return dict(sorted(rows.items(), key=lambda item: (item[0].split()[0] == "test", " " not in item[0], item[0])))


def checks(rows: dict[str, dict[str, float]], targets: dict[str, dict[str, float]]) -> list[tuple[str, float, bool]]:
    """Each target's name, measured value and whether it lies in its range."""
    train, test = rows["train"], rows["test"]
    values = {
        "sampled_minus_random": train["sampled"] - train["random"],
        "sampled_success": train["sampled"],
        "greedy_success": train["greedy"],
        "entropy_ratio": train["entropy_ratio"],
        "goal_sensitivity": train["goal_sensitivity"],
        "train_minus_test": train["sampled"] - test["sampled"],
    }
    unknown = set(targets) - set(values)
    if unknown:
        raise ValueError(f"unknown targets {sorted(unknown)}; known: {sorted(values)}")
    result = []
    for name, bounds in targets.items():
        value = values[name]
        inside = bounds.get("min", -math.inf) <= value <= bounds.get("max", math.inf)
        result.append((name, value, inside))
    return result
