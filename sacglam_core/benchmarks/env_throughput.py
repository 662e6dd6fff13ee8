"""Vector-environment throughput: 32 Playground-Text environments stepping with random valid actions.

    python -m sacglam_core.benchmarks.env_throughput [--num-envs 32] [--steps 3000] [--simplified]

Prints environment steps per second (one process, one thread). The target is at least 20,000 steps/s,
so that the environment costs nothing next to the LLM.
"""

from __future__ import annotations

import argparse
import random
import time

from sacglam_core.benchmarks import add_threads_argument, pin_threads
from sacglam_core.envs import EnvConfig, VectorPlayground


def measure(num_envs: int, vector_steps: int, config: EnvConfig, seed: int = 0) -> dict[str, float]:
    envs = VectorPlayground(num_envs, config, seed=seed)
    rng = random.Random(seed)
    _, infos = envs.reset()
    episodes = successes = 0
    start = time.perf_counter()
    for _ in range(vector_steps):
        actions = [rng.choice(candidates) for candidates in infos["possible_actions"]]
        _, rewards, terminated, truncated, infos = envs.step(actions)
        episodes += int((terminated | truncated).sum())
        successes += int(rewards.sum())
    elapsed = time.perf_counter() - start
    return {
        "env_steps_per_s": num_envs * vector_steps / elapsed,
        "episodes": episodes,
        "random_success_rate": successes / max(episodes, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3000, help="vector steps to time")
    parser.add_argument("--simplified", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    add_threads_argument(parser)
    args = parser.parse_args()
    pin_threads(args.threads)
    config = EnvConfig.simplified_variant() if args.simplified else EnvConfig()
    print(f"Playground-Text vector env: {args.num_envs} envs, {args.steps} vector steps, {config}")
    for repeat in range(args.repeats):
        r = measure(args.num_envs, args.steps, config, seed=repeat)
        print(
            f"  run {repeat}: {r['env_steps_per_s']:>10,.0f} env steps/s   "
            f"({r['episodes']} episodes, random-policy success {r['random_success_rate']:.3f})"
        )


if __name__ == "__main__":
    main()
