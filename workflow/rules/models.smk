# Models: the tiny ones are built offline; Hugging Face ones are staged into a shared cache on the
# login node (which has internet access), so that compute jobs run with HF_HUB_OFFLINE=1.


localrules:
    build_tiny_models,
    stage_model,


rule build_tiny_models:
    input:
        "sacglam_core/models/tiny.py",
        "sacglam_core/models/tokenizer.py",
    output:
        directory(MODELS / "tiny-t5"),
        directory(MODELS / "tiny-causal"),
    log:
        MODELS / "build-tiny.log",
    shell:
        "{PYTHON} -m sacglam_core.models build-tiny {MODELS} > {log} 2>&1"


def staged_flag(name):
    return HF_CACHE / ".staged" / (name.replace("/", "--") + ".done")


rule stage_model:
    output:
        HF_CACHE / ".staged" / "{name}.done",
    params:
        hub_id=lambda wildcards: wildcards.name.replace("--", "/"),
    shell:
        "{PYTHON} -m sacglam_core.models stage {params.hub_id} --cache-dir {HF_CACHE} && touch {output}"


def model_input(run):
    model = run.config.model
    return [model.name_or_path] if model.is_local_path else [staged_flag(model.name_or_path)]
