"""Command line: `python -m sacglam_core.models build-tiny <dir>`, `... build-pretrained <dir>`,
`... prior <model-dir> [--targets FILE]` and `... stage <hub-id> --cache-dir <dir> [--revision <commit>]`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.models", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    tiny = commands.add_parser("build-tiny", help="build the tiny T5 and causal LM offline (deterministic)")
    tiny.add_argument("out_dir")
    tiny.add_argument("--seed", type=int, default=0)
    pretrained = commands.add_parser("build-pretrained", help="build the tiny causal LM pre-trained on language")
    pretrained.add_argument("out_dir")
    pretrained.add_argument("--seed", type=int, default=0)
    prior = commands.add_parser("prior", help="a model's zero-shot policy on the demo's task, against its targets")
    prior.add_argument("model", help="a local model folder, e.g. resources/models/tiny-causal-pretrained")
    prior.add_argument("--targets", default="workflow/config/prior_targets.yaml")
    stage = commands.add_parser("stage", help="download a Hugging Face model into a shared cache (needs internet)")
    stage.add_argument("name", help="hub id, e.g. google/flan-t5-base")
    stage.add_argument("--cache-dir", default=None)
    stage.add_argument("--revision", default=None, help="the commit to stage (the cache's `main` then points to it)")
    args = parser.parse_args(argv)
    if args.command == "stage":  # on a login node: no torch
        from sacglam_core.models.hub import stage

        print(stage(args.name, args.cache_dir, args.revision))
        return 0
    from sacglam_core.cpu import pin_kernels

    pin_kernels()  # the same weights and the same prior on every x86-64 CPU
    import torch

    if args.command in ("build-tiny", "build-pretrained"):
        from sacglam_core.models.tiny import TinySpec, build_pretrained, build_tiny

        # One thread: multi-threaded float reductions differ from process to process, and so would the weights.
        torch.set_num_threads(1)
        build = build_tiny if args.command == "build-tiny" else build_pretrained
        build(args.out_dir, TinySpec(seed=args.seed))
    else:
        from sacglam_core.models.prior import report

        torch.set_num_threads(1)
        return 0 if report(args.model, args.targets) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
