"""SAC-GLAM: regenerate the paper's results.

    snakemake --profile profiles/slurm -n --quiet rules  # plan: the runs to train, their GPU-hour budget, the
                                                         # preflight, then a summary per experiment; without
                                                         # --quiet rules every job is listed too
    snakemake --profile profiles/slurm                   # on a SLURM cluster (submitit, Apptainer, 4 GPUs per
                                                         # run); stop it any time: the jobs keep running, the
                                                         # next one re-attaches
    snakemake --profile profiles/local                   # on a laptop CPU, the tiny model
    snakemake --profile profiles/local figures           # figures and tables from existing metrics
    snakemake --profile profiles/local --report results/report.html

The profiles leave out `quiet: [rules]`: it would hide a real run's job errors as well as a dry run's listing.

Experiments are configuration (workflow/config/experiments.yaml); see README.md.
"""


configfile: "workflow/config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/container.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"


rule all:
    input:
        [marker(run) for run in RUNS],
        [path for name in SETTINGS.experiments for path in aggregate_outputs(name)],
        rules.goal_types.output,
        rules.calibration.output,
