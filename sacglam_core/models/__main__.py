"""Command line: `python -m sacglam_core.models build-tiny <dir>` and
`... stage <hub-id> --cache-dir <dir> [--revision <commit>]`."""

from __future__ import annotations

import argparse

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    tiny = commands.add_parser("build-tiny", help="build the tiny T5 and causal LM offline (deterministic)")
    tiny.add_argument("out_dir")
    tiny.add_argument("--seed", type=int, default=0)
    stage = commands.add_parser("stage", help="download a Hugging Face model into a shared cache (needs internet)")
    stage.add_argument("name", help="hub id, e.g. google/flan-t5-base")
    stage.add_argument("--cache-dir", default=None)
    stage.add_argument("--revision", default=None, help="the commit to stage (the cache's `main` then points to it)")
    args = parser.parse_args(argv)
    if args.command == "build-tiny":
        from sacglam_core.models.tiny import TinySpec, build_tiny

        # One thread: multi-threaded float reductions differ from process to process, and so would the weights.
        torch.set_num_threads(1)
        build_tiny(args.out_dir, TinySpec(seed=args.seed))
    else:
        from sacglam_core.models.loading import stage as stage_model

        print(stage_model(args.name, args.cache_dir, args.revision))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
