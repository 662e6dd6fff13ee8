"""One-off studies behind earlier choices: each runs as a command and prints what it measured.

    python -m sacglam_core.studies.compare_revisions --baseline REV [--settings this|baseline|each]
        training throughput of this tree against another git revision, side by side in one run, and
        whether the two runs' non-timing metrics agree
    python -m sacglam_core.studies.final_policies RUN ... [--episodes-per-type N]
        finished runs' final policies evaluated sampled, with the greedy actor and on the critic's argmax Q
    python -m sacglam_core.studies.run_length [--experiments run_length_1x run_length_4x run_length_10x]
        final success and the critic's agreement with the planner against the run's length
        (docs/studies/run-length.md)

They take `--threads` (default 1) like the benchmarks, whose helpers they use (`sacglam_core.benchmarks`).
Their findings, and the studies removed from the tree: docs/studies/benchmark-studies.md.
"""
