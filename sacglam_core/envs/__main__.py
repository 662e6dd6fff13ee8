"""Command line: `python -m sacglam_core.envs goals --split train|test [--simplified]`, `... stats` and
`... random --grasp-rule holding|event` (the uniform random policy's success per goal type)."""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter

from sacglam_core.envs.goals import GoalType, catalog
from sacglam_core.envs.playground import EnvConfig, PlaygroundText


def goal_type_counts(split: str, simplified: bool = False) -> Counter:
    goals = catalog()
    return Counter(goals.parse(text).type for text in goals.goals(split, simplified))


def print_stats() -> None:
    print(f"{'goal type':<18}{'train':>8}{'test':>8}")
    counts = {split: goal_type_counts(split) for split in ("train", "test")}
    for goal_type in GoalType:
        print(f"{goal_type.value:<18}{counts['train'][goal_type]:>8}{counts['test'][goal_type]:>8}")
    totals = {split: sum(c.values()) for split, c in counts.items()}
    print(f"{'total':<18}{totals['train']:>8}{totals['test']:>8}")
    for split, c in counts.items():
        sequential = c[GoalType.GROW_THEN_GRASP] + c[GoalType.GROW_THEN_GROW]
        print(f"sequential share ({split}): {100 * sequential / totals[split]:.2f}%")
    simple = {split: sum(goal_type_counts(split, simplified=True).values()) for split in ("train", "test")}
    print(f"simplified variant (simple goals only, N=3): train {simple['train']}, test {simple['test']}")


def random_success(config: EnvConfig, episodes: int, seed: int = 0) -> dict[GoalType, float]:
    """Success of the uniform random policy per goal type, on `episodes` train goals drawn per type."""
    goals = catalog()
    rates = {}
    # The same draws per type whatever happened in other types.
    for goal_type, pool in goals.by_type("train", config.simplified).items():
        rng, env = random.Random(f"{seed}:{goal_type}"), PlaygroundText(config, seed=seed)
        successes = 0
        for _ in range(episodes):
            _, info = env.reset(options={"goal": rng.choice(pool)})
            done = False
            while not done:
                _, reward, terminated, truncated, info = env.step(rng.choice(info["possible_actions"]))
                done = terminated or truncated
            successes += reward > 0
        rates[goal_type] = successes / episodes
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.envs", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    goals = commands.add_parser("goals", help="print one goal per line")
    goals.add_argument("--split", choices=("train", "test"), default="train")
    goals.add_argument("--simplified", action="store_true", help="simple goals only")
    commands.add_parser("stats", help="print the number of goals per type and split")
    chance = commands.add_parser("random", help="print the random policy's success per goal type")
    chance.add_argument("--grasp-rule", choices=("holding", "event"), default="holding")
    chance.add_argument("--episodes", type=int, default=2000, help="episodes per goal type")
    chance.add_argument("--simplified", action="store_true", help="simple goals only, N=3 objects")
    args = parser.parse_args(argv)
    if args.command == "goals":
        sys.stdout.write("".join(f"{g}\n" for g in catalog().goals(args.split, args.simplified)))
    elif args.command == "random":
        config = (EnvConfig.simplified_variant if args.simplified else EnvConfig)(grasp_rule=args.grasp_rule)
        for goal_type, rate in random_success(config, args.episodes).items():
            print(f"{goal_type.value:<18}{100 * rate:6.1f}%")
    else:
        print_stats()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
