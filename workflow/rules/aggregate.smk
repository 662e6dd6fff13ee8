# Aggregation: each experiment's figures and tables, made again whenever one of its runs finishes;
# Figure 4 from the environment itself; the measured calibration of the GPU-hour budget. The figures and tables
# are `update()` outputs: Snakemake keeps the previous ones while the aggregation runs and puts them back if it
# fails. Its warnings (finished runs left out) and errors are one line each, on the console and in aggregate.log.
#   snakemake figures                          every figure and table again from the metrics that exist
#   snakemake --report results/report.html     the HTML report of the outputs made so far


for _name in SETTINGS.experiments:

    rule:
        name:
            f"aggregate_{_name}"
        input:
            [marker(run) for run in runs_of(_name)],
        output:
            [
                report_if_present(update(path), caption="../report/figure.rst", category=_name, subcategory="figures")
                if path.endswith(".png")
                else report_if_present(update(path), caption="../report/table.rst", category=_name, subcategory="tables")
                if path.endswith(".csv")
                else update(path)
                for path in aggregate_outputs(_name)
            ],
        log:
            RESULTS / _name / "aggregate.log",
        params:
            python=PYTHON,
            experiment=_name,
        run:
            shell(
                "{params.python} -m sacglam_core.reports.outputs {params.experiment} --definitions {DEFINITION_FILES} --results {RESULTS} --models {MODELS} "
                "2>&1 | tee {log}"
            )


rule goal_types:
    output:
        report_if_present(str(RESULTS / "figure4.png"), caption="../report/goal_types.rst", category="environment"),
        str(RESULTS / "figure4.pdf"),
    log:
        RESULTS / "figure4.log",
    params:
        python=PYTHON,
    run:
        shell("{params.python} workflow/scripts/goal_types.py {output[0]} > {log} 2>&1")


rule calibration:
    input:
        [marker(run) for run in RUNS],
    output:
        report_if_present(str(RESULTS / "calibration.yaml"), caption="../report/calibration.rst", category="budget"),
    log:
        RESULTS / "calibration.log",
    run:
        write_calibration(SETTINGS.budget.calibration, RESULTS, output[0], log[0])


rule figures:
    """Every figure and table again, from the metrics that exist now: nothing is trained. An experiment
    without finished runs is skipped with a message."""
    log:
        RESULTS / "figures.log",
    params:
        python=PYTHON,
        experiments=SETTINGS.experiments,
    run:
        shell("{params.python} -m sacglam_core.reports.outputs {params.experiments} --definitions {DEFINITION_FILES} --results {RESULTS} --models {MODELS} 2>&1 | tee {log}")
