"""Command line: `python -m sacglam_core.models stage <hub-id> --cache-dir <dir> [--revision <commit>]` downloads a
Hugging Face model into a shared cache (on a login node: no torch). The tiny models: `python -m sacglam_core.tiny`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    stage = commands.add_parser("stage", help="download a Hugging Face model into a shared cache (needs internet)")
    stage.add_argument("name", help="hub id, e.g. google/flan-t5-base")
    stage.add_argument("--cache-dir", default=None)
    stage.add_argument("--revision", default=None, help="the commit to stage (the cache's `main` then points to it)")
    args = parser.parse_args(argv)
    from sacglam_core.models.hub import stage

    print(stage(args.name, args.cache_dir, args.revision))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
