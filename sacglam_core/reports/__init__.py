"""The workflow's results side: per-seed metrics aggregated into the paper's numbers, its tables and figures, and the
claims checked as statistics over seed pairs (used by the Snakefile's aggregation rules)."""
