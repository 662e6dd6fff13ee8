"""What limits a finished run's final policy: its success when it samples (as it acts and as the runs are
evaluated), when it takes its most probable action, and, for SAC, when it takes the critic's best action.

    python -m sacglam_core.studies.final_policies results/mini_sac_tuning/SAC-GLAM-*/seed10? \\
        results/mini_sac_tuning/PPO-GLAM-*/seed10? [--episodes-per-type 128]

Each run's latest checkpoint is loaded with its own configuration (run it from the directory the runs were
trained in: model paths are relative). With the run's own evaluation plan, the sampled success must equal the
last row of its metrics.csv (a check that the right policy was loaded); `--episodes-per-type` evaluates more
episodes on the same plan's seed, for all three policies alike. If argmax Q beats the greedy actor, the actor
does not extract what its critic knows; if the greedy actor beats the sampled one, the policy's entropy costs
success at evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd
import torch

from sacglam_core.agent import AgentConfig, GlamAgent
from sacglam_core.benchmarks import add_threads_argument, pin_threads, positive
from sacglam_core.checkpoint import Checkpointer
from sacglam_core.config import ConfigError, load_config
from sacglam_core.device_plan import DevicePlan
from sacglam_core.distributed import init_ranks
from sacglam_core.envs.playground import ACTION_VOCABULARY
from sacglam_core.evaluation import Policy, agent_policy, evaluate


def critic_greedy(agent: GlamAgent) -> Policy:
    """The candidate with the highest Q in each state."""

    @torch.no_grad()
    def act(goals, observations, candidates):
        batch = agent.batch(goals, observations, candidates)
        policy, policy_pass = agent.policy(batch, hidden=agent.critic.reads_policy_pass())
        q = agent.q(batch, policy_pass=policy_pass)
        return q.masked_fill(~policy.mask, float("-inf")).argmax(1).tolist()

    return act


def final_success(run: Path, episodes_per_type: int | None) -> dict[str, float]:
    overrides = {"eval": {"episodes_per_type": episodes_per_type}} if episodes_per_type else {}
    config = load_config(run / "config.yaml", overrides)
    plan = DevicePlan.of_run(config)
    ranks = init_ranks(plan)
    sac = config.algorithm == "sac"
    agent = GlamAgent.from_config(AgentConfig.of_run(config, plan), ACTION_VOCABULARY)
    loaded = Checkpointer(run / "checkpoints", config.checkpoint.keep, ranks).load_latest()
    if loaded is None:
        raise SystemExit(f"error: {run} has no checkpoint to load")
    shared, _ = loaded
    steps = shared["counters"]["env_steps"]
    if steps != config.total_steps:
        raise SystemExit(f"error: {run} has not finished ({steps} of {config.total_steps} steps)")
    agent.load_mutable_state_dict(shared["agent"])
    last_round = shared["counters"]["eval_rounds"] - 1  # the final evaluation's generator
    greedy = dataclasses.replace(config, eval=dataclasses.replace(config.eval, greedy=True))
    result = {
        "sampled": evaluate(lambda: agent_policy(agent, config, last_round), config, ranks)["eval_success"],
        "greedy actor": evaluate(lambda: agent_policy(agent, greedy, last_round), config, ranks)["eval_success"],
    }
    if sac:
        result["argmax Q"] = evaluate(lambda: critic_greedy(agent), config, ranks)["eval_success"]
    if not episodes_per_type:
        logged = float(pd.read_csv(run / "metrics.csv")["eval_success"].iloc[-1])
        if abs(logged - result["sampled"]) > 1e-9:
            raise SystemExit(f"error: {run}: sampled success {result['sampled']} is not the logged {logged}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories (with checkpoints/)")
    parser.add_argument("--episodes-per-type", type=positive, default=None, help="default: the run's own")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    rows = []
    for run in args.runs:
        try:
            success = final_success(run, args.episodes_per_type)
        except ConfigError as error:
            raise SystemExit(f"error: {error}") from None
        rows.append({"variant": run.parent.name.rsplit("-", 1)[0], **success})
        print(f"{run}: " + ", ".join(f"{k} {v:.3f}" for k, v in success.items()), flush=True)
    table = pd.DataFrame(rows).groupby("variant", sort=False)
    print(table.agg(lambda x: f"{x.mean():.3f} ± {x.std(ddof=1):.3f}" if x.notna().any() else "-").to_markdown())


if __name__ == "__main__":
    main()
