# One training run: submitted (or re-attached to) and waited for by the driver, in a thread of this process
# (sacglam_core/jobs/driver.py). Its output is the marker written once done.json exists: done.json itself is
# never a Snakemake output, so no rerun or cleanup of Snakemake's ever deletes a finished run.


rule train:
    input:
        train_inputs,
    output:
        RESULTS / "{experiment}" / "{variant}" / "seed{seed}" / MARKER,
    log:
        RESULTS / "{experiment}" / "{variant}" / "seed{seed}" / "driver.log",
    threads: train_threads
    priority: train_priority
    retries: LAUNCHER.retries
    wildcard_constraints:
        experiment="[^/]+",
        variant="[^/]+",
        seed=r"\d+",
    run:
        DRIVER.train(run_of(wildcards), output[0], log[0])
