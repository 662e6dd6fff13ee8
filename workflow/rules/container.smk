# The Apptainer image, built on the login node when missing or older than its definition.


localrules:
    container,


if LAUNCHER.container:

    rule container:
        input:
            definition="containers/sacglam.def",
            project="pyproject.toml",
            sources=sorted(str(p) for p in Path("sacglam_core").rglob("*.py")),
        output:
            LAUNCHER.container,
        log:
            "resources/container-build.log",
        shell:
            "apptainer build --force {output} {input.definition} > {log} 2>&1"


def container_input(wildcards):
    return [LAUNCHER.container] if LAUNCHER.container else []
