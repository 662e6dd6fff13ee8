"""The collapse benchmark's probes are valid runs, and its summary reads the right rows."""

import pytest

from sacglam_core.benchmarks.compare_revisions import run_config
from sacglam_core.benchmarks.warmup_collapse import PROBES, summary
from sacglam_core.config import parse_config
from sacglam_core.pipeline.experiments import merge


@pytest.mark.parametrize("group", sorted(PROBES))
def test_every_probe_is_a_valid_run_of_the_mini(group, tiny_models):
    base = run_config("mini", "SAC-GLAM+HER", 640, str(tiny_models), 1)
    for change in PROBES[group].values():
        config = parse_config(merge(base, change | {"seed": 100, "output_dir": "unused"}))
        assert config.algorithm == "sac"


def test_summary_puts_the_lowest_entropy_next_to_its_targets():
    def row(step, success, entropy="", target=""):
        return {"env_steps": str(step), "eval_success": success, "entropy": entropy, "target_policy_entropy": target}

    rows = [
        row(0, "0.1"),
        row(256, "0.2", "1.80", "1.85"),
        row(512, "0.0", "0.01", "0.99"),
        row(768, "0.3", "0.5", "0.6"),
    ]
    assert summary(rows) == (
        "success 0.10 0.20 0.00 0.30; entropy first 1.80 at step 256, lowest 0.01 (its target's 0.99) at step 512"
    )
    assert summary(rows[:1]) == "success 0.10; no actor update"
