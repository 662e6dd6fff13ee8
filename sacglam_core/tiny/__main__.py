"""Command line: `python -m sacglam_core.tiny build-tiny <dir> [--train]` and `... build-pretrained <dir> [--train]`.

The builds write the shipped weights of the causal LMs (checked against their SHA-256); `--train` trains them
again and says whether this CPU gives the shipped bytes."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.tiny", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    tiny = commands.add_parser("build-tiny", help="build the tiny T5 and causal LM offline (deterministic)")
    tiny.add_argument("out_dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--train", action="store_true", help="train tiny-causal instead of writing the shipped weights")
    pretrained = commands.add_parser("build-pretrained", help="build the tiny causal LM pre-trained on language")
    pretrained.add_argument("out_dir")
    pretrained.add_argument("--seed", type=int, default=0)
    pretrained.add_argument("--train", action="store_true", help="train it instead of writing the shipped weights")
    args = parser.parse_args(argv)
    from sacglam_core.cpu import pin_kernels

    pin_kernels()  # the same weights on every x86-64 CPU
    import torch

    from sacglam_core.tiny.build import SHIPPED, ShippedWeightsError, TinySpec, build_pretrained, build_tiny, sha256

    # One thread: multi-threaded float reductions differ from process to process, and so would the weights.
    torch.set_num_threads(1)
    build = build_tiny if args.command == "build-tiny" else build_pretrained
    try:
        built = build(args.out_dir, TinySpec(seed=args.seed), train=args.train)
    except ShippedWeightsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in built.values() if isinstance(built, dict) else [built]:
        if args.train and args.seed == 0 and path.name in SHIPPED:
            same = sha256(path / "model.safetensors") == SHIPPED[path.name]
            print(f"{path.name}: {'the same bytes as' if same else 'other bytes than'} the shipped weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
