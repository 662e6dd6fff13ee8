"""The GPU node check's logic on a CPU (benchmarks/node_check.py): what a GPU session runs as one script."""

import json

import pytest
import torch
import yaml

from sacglam_core.benchmarks import node_check


@pytest.mark.slow
def test_the_node_check_runs_its_parts_on_a_cpu_and_writes_their_figures(tmp_path, tiny_models):
    """Two gloo processes against two ranks in one process (and the latter again, which a CPU repeats exactly),
    float16 (eager on a CPU) with a forced overflow, and the first job with the tiny T5 staged as the hub model: every
    check passes but the GPU's."""
    command = ["--device", "cpu", "--out", str(tmp_path), "--model", str(tiny_models["tiny-t5"]), "--repeat"]
    status = node_check.main(command)
    parts = {r["part"]: r for r in map(json.loads, (tmp_path / "node_check.jsonl").read_text().splitlines())}
    assert list(parts) == ["processes", "float16", "first job"]
    assert parts["processes"]["failed"] == [] and parts["float16"]["failed"] == []
    for variant in ("SAC-GLAM+HER", "PPO-GLAM"):
        layouts = parts["processes"]["figures"][variant]
        assert layouts["2 processes"]["plan"].endswith("2 processes over gloo, collectives in the update")
        again = layouts["one process, again"]  # the same layout twice on a CPU: the same numbers
        assert (again["metrics"], again["weights"]) == (0.0, 0.0), again
        for layout in ("one", "two"):  # float32 products without TF32 on a GPU: a difference is the layout's
            run = yaml.safe_load((tmp_path / "runs" / "processes" / variant / f"{layout}.yaml").read_text())
            assert run["model"]["tf32"] is False
        overflow = parts["float16"]["figures"][variant]["forced overflow"]
        assert overflow["passed"] and overflow["scale_after"] == overflow["scale"] / 2
    failing = [line.split(": ", 1)[0] for line in parts["first job"]["failed"]]
    assert failing == ["first job"] and "FAIL  GPU" in parts["first job"]["failed"][0]
    assert status == 1  # the GPU check fails on a CPU


def fabricated_run(out, metrics: dict, weights: dict) -> None:
    (out / "checkpoints").mkdir(parents=True)
    header = ",".join(["env_steps", *metrics])
    (out / "metrics.csv").write_text(f"{header}\n0,{','.join(str(v) for v in metrics.values())}\n")
    torch.save({"agent": weights}, out / "checkpoints" / "ckpt-000000001.shared.pt")


def test_two_runs_are_judged_on_their_losses_and_on_how_much_of_the_training_differs(tmp_path):
    """A KL diagnostic 50% apart is reported and not judged; a loss 2% apart is; the weights' distance is a share of
    how far training moved them (a checksum could cancel or amplify)."""
    start = {"w": torch.zeros(4), "step": torch.tensor(3)}
    fabricated_run(tmp_path / "a", {"critic_loss": 1.0, "policy_kl": 2e-3}, {"w": torch.ones(4)})
    fabricated_run(tmp_path / "b", {"critic_loss": 1.0, "policy_kl": 1e-3}, {"w": torch.tensor([1.0, 1, 1, 1.02])})
    gap = node_check.differences(tmp_path / "a", tmp_path / "b", start)
    assert gap["metrics"] == 0.0 and gap["diagnostics"]["policy_kl"] == pytest.approx(0.5)
    assert gap["weights"] == pytest.approx(0.01)  # 0.02 apart against 2.0 moved
    fabricated_run(tmp_path / "c", {"critic_loss": 1.02, "policy_kl": 2e-3}, {"w": torch.ones(4)})
    gap = node_check.differences(tmp_path / "a", tmp_path / "c", start)
    assert gap["column"] == "critic_loss" and gap["metrics"] == pytest.approx(0.02 / 1.02)
    assert gap["weights"] == 0.0
