"""The workflow's jobs side: the GPU-hour budget and Snakemake's plan, launching runs through submitit, the driver that
submits and re-attaches to them, SLURM's client commands, model staging, a campaign's status and a first job's
verdict (used by the Snakefile and workflow/rules)."""
