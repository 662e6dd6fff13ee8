"""Benchmark scripts: each prints the figures it measures (`python -m sacglam_core.benchmarks.<name>`)."""
