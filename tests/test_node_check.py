"""The GPU node check's logic on a CPU (benchmarks/node_check.py): what a GPU session runs as one script."""

import json

import pytest

from sacglam_core.benchmarks import node_check


@pytest.mark.slow
def test_the_node_check_runs_its_parts_on_a_cpu_and_writes_their_figures(tmp_path, tiny_models):
    """Two gloo processes against two ranks in one process, float16 (eager on a CPU) with a forced overflow, and the
    first job with the tiny T5 staged as the hub model: every check passes but the GPU's."""
    status = node_check.main(["--device", "cpu", "--out", str(tmp_path), "--model", str(tiny_models["tiny-t5"])])
    parts = {r["part"]: r for r in map(json.loads, (tmp_path / "node_check.jsonl").read_text().splitlines())}
    assert list(parts) == ["processes", "float16", "first job"]
    assert parts["processes"]["failed"] == [] and parts["float16"]["failed"] == []
    for variant in ("SAC-GLAM+HER", "PPO-GLAM"):
        layouts = parts["processes"]["figures"][variant]
        assert layouts["2 processes"]["plan"].endswith("2 processes over gloo, collectives in the update")
        overflow = parts["float16"]["figures"][variant]["forced overflow"]
        assert overflow["passed"] and overflow["scale_after"] == overflow["scale"] / 2
    failing = [line.split(": ", 1)[0] for line in parts["first job"]["failed"]]
    assert failing == ["first job"] and "FAIL  GPU" in parts["first job"]["failed"][0]
    assert status == 1  # the GPU check fails on a CPU
