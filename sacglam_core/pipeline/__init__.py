"""The workflow's Python side: experiments expanded into runs, the GPU-hour budget, launching through
submitit, and the aggregation of results (used by the Snakefile and workflow/rules)."""
