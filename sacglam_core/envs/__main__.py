"""Command line: `python -m sacglam_core.envs goals --split train|test [--simplified]` and `... stats`."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from sacglam_core.envs.goals import GoalType, catalog


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.envs", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    goals = commands.add_parser("goals", help="print one goal per line")
    goals.add_argument("--split", choices=("train", "test"), default="train")
    goals.add_argument("--simplified", action="store_true", help="simple goals only")
    commands.add_parser("stats", help="print the number of goals per type and split")
    args = parser.parse_args(argv)
    if args.command == "goals":
        sys.stdout.write("".join(f"{g}\n" for g in catalog().goals(args.split, args.simplified)))
    else:
        print_stats()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
