"""The prior's check: a model's zero-shot policy on an experiment's task, before any RL, against the targets fixed
in workflow/config/prior_targets.yaml (docs/prior.md).

    python -m sacglam_core.pipeline.prior resources/models/tiny-causal-pretrained [--targets FILE]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from sacglam_core.config import RunConfig, parse_config
from sacglam_core.pipeline import yamlfile
from sacglam_core.pipeline.experiments import DEFINITION_FILES, expand, load_definitions, merge

TARGETS = "workflow/config/prior_targets.yaml"


def task_config(experiment: str, model: str, episodes_per_type: int) -> RunConfig:
    """The experiment's first run's configuration, with `model` and `episodes_per_type` episodes per goal type
    and as many test episodes."""
    definitions = load_definitions(*DEFINITION_FILES)
    run = expand(definitions, [experiment], "unused", {"models": str(Path(model).parent)})[0]
    overrides = {
        "model": {"name_or_path": model, "lora": None, "load_in_4bit": False, "dtype": "float32", "device": "cpu"},
        "eval": {"episodes_per_type": episodes_per_type, "test_episodes": episodes_per_type},
    }
    return parse_config(merge(run.settings, overrides), source=f"experiment {experiment!r} with {model}")


def report(model: str, targets_file: str | Path = TARGETS) -> bool:
    """Print the measurements and each target; whether all targets hold."""
    from sacglam_core.tiny.prior import checks, measure  # imports torch: after main's pin_kernels

    spec = yamlfile.load(targets_file, "prior targets")
    rows = measure(task_config(spec["experiment"], model, spec["episodes_per_type"]), spec["states"])
    n = spec["episodes_per_type"]
    print(f"{model} on {spec['experiment']}'s task: {n} episodes per goal type and split, {spec['states']} states each")
    head = ("random", 7), ("sampled", 8), ("greedy", 7), ("H/Huniform", 11), ("goal TV", 8), ("P(Grasp)", 9)
    print(f"  {'goals':<24} " + " ".join(f"{name:>{width}}" for name, width in head) + f" {'on nothing':>11}")
    for row, v in rows.items():
        print(
            f"  {row:<24} {v['random']:7.3f} {v['sampled']:8.3f} {v['greedy']:7.3f} "
            f"{v['entropy_ratio']:11.3f} {v['goal_sensitivity']:8.3f} {v['grasp']:9.3f} {v['grasp_on_nothing']:11.3f}"
        )
    se = math.sqrt(0.25 / n)
    print(f"  (a success rate's standard error is at most {se:.3f} per row; P(Grasp): over the random-play states,")
    print("  and over those where the agent stands on nothing, where taking is never the move)")
    results = checks(rows, spec["targets"])
    for name, value, inside in results:
        bounds = spec["targets"][name]
        span = f"[{bounds.get('min', '-inf')}, {bounds.get('max', 'inf')}]"
        print(f"{'HOLDS' if inside else 'MISSES'}  {name} = {value:.3f} in {span}")
    return all(inside for _, _, inside in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sacglam_core.pipeline.prior", description=__doc__)
    parser.add_argument("model", help="a local model folder, e.g. resources/models/tiny-causal-pretrained")
    parser.add_argument("--targets", default=TARGETS)
    args = parser.parse_args(argv)
    from sacglam_core.cpu import pin_kernels

    pin_kernels()  # the same prior on every x86-64 CPU
    import torch

    torch.set_num_threads(1)
    return 0 if report(args.model, args.targets) else 1


if __name__ == "__main__":
    raise SystemExit(main())
