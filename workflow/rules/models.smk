# Models: the tiny ones are built offline when missing, the causal LMs from the weights the project ships (their
# SHA-256 checked: sacglam_core/tiny/build.py), so every machine runs the demo from the same bytes, and made again
# when those weights change (runs depend on the models as `ancient`: a rebuild never re-runs a finished run);
# Hugging Face ones are staged at their pinned commit (model_revisions) into a shared cache on the login node
# (which has internet access), so that compute jobs run with HF_HUB_OFFLINE=1.


rule build_tiny_models:
    input:
        "sacglam_core/tiny/weights/tiny-causal.safetensors",
    output:
        directory(MODELS / "tiny-t5"),
        directory(MODELS / "tiny-causal"),
    log:
        MODELS / "build-tiny.log",
    params:
        python=PYTHON,
    run:
        shell("OMP_NUM_THREADS=1 {params.python} -m sacglam_core.tiny build-tiny {MODELS} > {log} 2>&1")


rule build_pretrained_model:
    input:
        "sacglam_core/tiny/weights/tiny-causal-pretrained.safetensors",
    output:
        directory(MODELS / "tiny-causal-pretrained"),
    log:
        MODELS / "build-pretrained.log",
    params:
        python=PYTHON,
    run:
        shell("OMP_NUM_THREADS=1 {params.python} -m sacglam_core.tiny build-pretrained {MODELS} > {log} 2>&1")


rule stage_model:
    output:
        HF_CACHE / staging.FLAGS / "{name}.done",
    log:
        HF_CACHE / staging.FLAGS / "{name}.log",
    params:
        python=PYTHON,
        hub_id=lambda wildcards: staging.hub_id(wildcards.name),
        revision=lambda wildcards: staging.revision(SETTINGS, staging.hub_id(wildcards.name)),
    run:
        shell(
            "{params.python} -m sacglam_core.models stage {params.hub_id} --revision {params.revision} "
            "--cache-dir {HF_CACHE} > {log} 2>&1 && touch {output}"
        )
