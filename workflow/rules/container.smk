# The Apptainer image of the trainer's dependencies (the code is the bound repository): built when missing or
# older than its definition or lock file, by containers/build.sh (which says what to do where the login node
# cannot build: build elsewhere and copy the .sif). Runs depend on it as `ancient`: a rebuild never re-runs one.

if LAUNCHER.container:

    rule container:
        input:
            definition="containers/sacglam.def",
            lock="containers/requirements.lock",
        output:
            LAUNCHER.container,
        log:
            "resources/container-build.log",
        run:
            shell("bash containers/build.sh {output} > {log} 2>&1")
