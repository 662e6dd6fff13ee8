"""compare_revisions against this repository's own HEAD: both trees train the same code and settings in two
processes at once, so their metrics must agree exactly."""

import subprocess
import sys

import pytest


@pytest.mark.slow  # two trainings of the demo's settings side by side
def test_this_tree_against_its_own_head_on_the_baselines_settings(tiny_models):
    models = tiny_models["tiny-causal"].parent
    # mini_control: the demo's settings on tiny-causal, which the fixture builds (the demo's pre-trained LM takes
    # minutes to build)
    command = [sys.executable, "-m", "sacglam_core.studies.compare_revisions", "--baseline", "HEAD",
               "--experiment", "mini_control", "--settings", "baseline", "--steps", "96", "--repeats", "1",
               "--models", str(models)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "settings of the baseline" in out
    assert "largest relative difference of the metrics 0.0e+00" in out, out
    assert "median ratio x" in out
