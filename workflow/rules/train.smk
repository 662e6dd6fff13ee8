# One training run: written to <run>/run.yaml and launched through submitit (see sacglam_core/pipeline/launch.py).


def run_of(wildcards):
    return RUN_BY_DIR[str(RESULTS / wildcards.experiment / wildcards.variant / f"seed{wildcards.seed}")]


rule train:
    input:
        model=lambda wildcards: model_input(run_of(wildcards)),
        image=container_input,
    output:
        RESULTS / "{experiment}" / "{variant}" / "seed{seed}" / "done.json",
    params:
        run=run_of,
        launcher=LAUNCHER,
        hf_cache=HF_CACHE,
    wildcard_constraints:
        experiment="[^/]+",
        variant="[^/]+",
        seed=r"\d+",
    resources:
        gpus=GPUS_PER_RUN,
        runtime=LAUNCHER.time_min,
    script:
        "../scripts/launch_run.py"
