# Aggregation: each experiment's figures and tables, made again whenever one of its runs finishes;
# Figure 4 from the environment itself; the measured calibration of the GPU-hour budget.
#   snakemake figures                          regenerate every figure and table from existing metrics
#   snakemake --report results/report.html     the HTML report, captions in workflow/report/
from sacglam_core.pipeline.outputs import expected_outputs, write_experiment_results

DEFINITIONS = load_definitions(SETTINGS.experiment_file)


def runs_of(name):
    return [run for run in RUNS if run.experiment == name]


def aggregate_outputs(name):
    return [str(p) for p in expected_outputs(name, DEFINITIONS["experiments"][name], RESULTS)]


for _name in SETTINGS.experiments:

    rule:
        name:
            f"aggregate_{_name}"
        input:
            [run_output(run) for run in runs_of(_name)],
        output:
            [
                report(path, caption="../report/figure.rst", category=_name, subcategory="figures")
                if path.endswith(".png")
                else report(path, caption="../report/table.rst", category=_name, subcategory="tables")
                if path.endswith(".csv")
                else path
                for path in aggregate_outputs(_name)
            ],
        params:
            experiment=_name,
            definition=DEFINITIONS["experiments"][_name],
            runs=runs_of(_name),
            results=RESULTS,
        script:
            "../scripts/aggregate.py"


rule goal_types:
    output:
        report(str(RESULTS / "figure4.png"), caption="../report/goal_types.rst", category="environment"),
        str(RESULTS / "figure4.pdf"),
    script:
        "../scripts/goal_types.py"


rule calibration:
    input:
        [run_output(run) for run in RUNS],
    output:
        report(str(RESULTS / "calibration.yaml"), caption="../report/calibration.rst", category="budget"),
    params:
        table=BUDGET.calibration,
    script:
        "../scripts/calibration.py"


rule figures:
    """Every figure and table again, from the metrics that exist now: nothing is trained."""
    run:
        for name in SETTINGS.experiments:
            write_experiment_results(name, DEFINITIONS["experiments"][name], runs_of(name), RESULTS)
