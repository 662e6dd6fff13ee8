"""The zero-shot prior's measurements and its targets (python -m sacglam_core.pipeline.prior)."""

import math
import subprocess
import sys

import pytest
import yaml

from sacglam_core.tiny.prior import checks

ROWS = {
    "train": {"random": 0.1, "sampled": 0.3, "greedy": 0.5, "entropy_ratio": 0.7, "goal_sensitivity": 0.2},
    "test": {"random": 0.1, "sampled": 0.28, "greedy": 0.4, "entropy_ratio": 0.7, "goal_sensitivity": 0.2},
}


def test_each_target_is_checked_against_its_range():
    targets = {"sampled_minus_random": {"min": 0.05}, "greedy_success": {"max": 0.4}, "train_minus_test": {"max": 0.05}}
    result = {name: (round(value, 6), inside) for name, value, inside in checks(ROWS, targets)}
    assert result == {
        "sampled_minus_random": (0.2, True),
        "greedy_success": (0.5, False),
        "train_minus_test": (0.02, True),
    }


def test_an_unknown_target_is_refused():
    with pytest.raises(ValueError, match="unknown targets \\['sampled'\\]"):
        checks(ROWS, {"sampled": {"min": 0}})


def test_the_command_prints_every_row_and_target_and_fails_on_a_miss(tiny_models, tmp_path):
    """The uniform-prior control: near-uniform (its entropy ratio holds a high floor), and blind enough to goals
    that a sensitivity of 0.9 is missed, so the command exits 1."""
    targets = tmp_path / "targets.yaml"
    spec = {"experiment": "mini", "episodes_per_type": 2, "states": 8}
    spec["targets"] = {"entropy_ratio": {"min": 0.9}, "goal_sensitivity": {"min": 0.9}}
    targets.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "sacglam_core.pipeline.prior", str(tiny_models["tiny-causal"]), "--targets"]
    result = subprocess.run([*command, str(targets)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    out = result.stdout
    for row in ("train grasp", "train grow", "test grasp", "test grow"):
        assert f"  {row} " in out
    assert "HOLDS  entropy_ratio" in out and "MISSES  goal_sensitivity" in out
    # near-uniform: `Grasp` gets about one candidate's share (5 to 8 candidates), standing on nothing too
    grasp, on_nothing = (float(x) for x in next(r for r in out.splitlines() if r.startswith("  train ")).split()[-2:])
    assert "P(Grasp)" in out and 0.08 < grasp < 0.3 and (math.isnan(on_nothing) or 0.08 < on_nothing < 0.3)
