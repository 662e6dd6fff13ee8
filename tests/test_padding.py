"""The padding benchmark counts each layout's real tokens and padded size as the scorer builds them."""

import subprocess
import sys

from sacglam_core.benchmarks.padding import real_shares


def test_real_tokens_and_padded_sizes_of_each_layout():
    prompts = [[5, 6, 7], [5, 6, 7, 8, 9]]
    candidates = [[[1], [1, 2]], [[1, 2, 3]]]
    shares = real_shares(prompts, candidates, left=True)
    assert shares["prompts"] == (8, 2 * 5)
    assert shares["actions"] == (6, 3 * 3)
    assert shares["action slots"] == (6, 2 * 2 * 3)  # 2 prompts x 2 candidates at most x 3 tokens
    assert shares["prompt+action"] == (4 + 5 + 8, 3 * 8)


def test_the_command_prints_every_layout_and_refuses_an_unknown_experiment(tiny_models):
    command = [sys.executable, "-m", "sacglam_core.benchmarks.padding", "--models", str(tiny_models["tiny-t5"].parent)]
    out = subprocess.run([*command, "--experiment", "mini", "--batches", "3", "--steps", "30"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "1 CPU thread(s)" in out and "batches of 64" in out
    assert sum("% real tokens" in line for line in out.splitlines()) == 4
    bad = subprocess.run([*command, "--experiment", "nosuch"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error: unknown experiment")
