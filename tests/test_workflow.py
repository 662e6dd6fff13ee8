"""The workflow: experiments expanded into runs, its settings, dry runs and the local profile."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sacglam_core.config import dump_config, parse_config
from sacglam_core.lease import holder
from sacglam_core.metrics import COLUMNS, evaluation_steps
from sacglam_core.pipeline.config import WorkflowConfigError, load_workflow_config, parse_workflow_config, slurm_minutes
from sacglam_core.pipeline.experiments import ExperimentError, Run, expand, load_definitions, merge
from sacglam_core.reports.aggregate import load_experiment
from sacglam_core.reports.outputs import expected_outputs
from sacglam_core.runfiles import MARKER

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [str(Path(sys.executable).parent / "snakemake")]
DEFINITIONS = ROOT / "workflow" / "config" / "experiments.yaml"
STUDIES = ROOT / "workflow" / "config" / "studies.yaml"
PAPER = ["main", "critic_architecture", "update_frequency", "her_sampling", "nstep_buffer", "ppo_her"]
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "pandas", "scipy", "matplotlib")
# sitecustomize.py of a process where the trainer's packages cannot be imported, as on a driver-only install
NO_TORCH = """import sys
class NoTrainerPackages:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "bitsandbytes", "peft", "accelerate", "tensorboard"):
            raise ImportError(f"{name} is not installed (driver-only)")
sys.meta_path.insert(0, NoTrainerPackages())
"""


@pytest.fixture(scope="module")
def definitions():
    return load_definitions(DEFINITIONS, STUDIES)


def test_every_experiment_expands_into_valid_runs(definitions):
    runs = expand(definitions, list(definitions["experiments"]), "results", {"models": "resources/models"})
    by_experiment = {}
    for run in runs:
        by_experiment.setdefault(run.experiment, []).append(run)
        assert run.config.seed == run.seed  # validated as a run configuration
    assert len(by_experiment["main"]) == 3 * 4  # PPO, SAC, SAC+HER x 4 seeds
    assert {r.variant for r in by_experiment["critic_architecture"]} == {
        "input=obs_action weights=shared",
        "input=obs_action weights=shared_frozen",
        "input=obs weights=shared",
        "input=obs weights=shared_frozen",
    }
    assert all(r.config.env.simplified for r in by_experiment["critic_architecture"])
    main = {r.variant: r.config for r in by_experiment["main"]}
    assert main["SAC-GLAM+HER"].her.enabled and main["SAC-GLAM+HER"].sac.alpha_init == 0.05
    assert main["PPO-GLAM"].model.name_or_path == "google/flan-t5-base" and main["PPO-GLAM"].total_steps == 400_000
    assert len({r.directory for r in runs}) == len(runs)


def test_run_directories_are_named_from_the_settings(definitions):
    (before,) = [r for r in expand(definitions, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert before.directory.parent.name.startswith("SAC-GLAM-") and before.directory.name == "seed0"
    changed = yaml.safe_load(DEFINITIONS.read_text())
    changed["experiments"]["main"]["variants"]["SAC-GLAM"]["sac"] = {"n_step": 5}
    (after,) = [r for r in expand(changed, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert after.directory != before.directory  # a changed variant never reuses finished runs
    again = [r for r in expand(definitions, ["main"], "results") if r.variant == "SAC-GLAM" and r.seed == 0]
    assert again[0].directory == before.directory  # stable across invocations


def test_adding_a_seed_or_an_experiment_is_configuration(definitions):
    extended = yaml.safe_load(DEFINITIONS.read_text())
    extended["experiments"]["main"]["seeds"].append(7)
    extended["experiments"]["gamma"] = {
        "seeds": [0],
        "settings": {"algorithm": "sac"},
        "grid": {"sac.gamma": [0.9, 0.99]},
    }
    runs = expand(extended, ["main", "gamma"], "results")
    assert sum(r.experiment == "main" for r in runs) == 15
    assert sorted(r.config.sac.gamma for r in runs if r.experiment == "gamma") == [0.9, 0.99]


def _panels(d: dict) -> None:
    d["experiments"]["critic_architecture"]["figures"]["figure5"]["panels"]["extra"] = ["input=obs weights=frozen"]


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("figure12", lambda d: None, "unknown experiment(s) ['figure12']"),
        ("main", lambda d: d["experiments"]["main"].update(seed=[1]), "unknown keys ['seed']"),
        ("main", lambda d: d["experiments"]["main"]["variants"]["SAC-GLAM"].update(sac={"n_steps": 2}), "sac.n_steps"),
        ("main", lambda d: d["experiments"]["main"].pop("variants"), "defines no variants"),
        ("critic_architecture", _panels, "panel 'extra': unknown variants ['input=obs weights=frozen']"),
        ("main", lambda d: d["experiments"]["main"]["figures"]["figure2"].update(x=["steps"]), "unknown x axes"),
        ("main", lambda d: d["experiments"]["main"].update(seeds=[0, 1, 0]), "seeds [0, 1, 0] repeat [0]"),
    ],
)
def test_bad_experiment_definitions_are_rejected(name, change, message):
    definitions = yaml.safe_load(DEFINITIONS.read_text())
    change(definitions)
    with pytest.raises(ExperimentError, match=re.escape(message)):
        expand(definitions, [name], "results")


@pytest.mark.parametrize(
    "seeds, message",
    [
        ("5", "seeds must be a non-empty list of integers, got 5"),
        ("[]", "seeds must be a non-empty list of integers, got []"),
        ("[0, true]", "seed True is not a non-negative integer"),
        ('[0, "007"]', "seed '007' is not a non-negative integer"),
        ("[1, -2]", "seed -2 is not a non-negative integer"),
        ("[0.5]", "seed 0.5 is not a non-negative integer"),
        ("[3, 1, 3]", "seeds [3, 1, 3] repeat [3]"),
    ],
)
def test_seeds_are_distinct_non_negative_integers_named_with_the_file(tmp_path, seeds, message):
    """A seed names its run's directory (`seed<k>`): each bad value is one line naming the file, the experiment
    and the value, given when the definitions are read (before any run is planned)."""
    path = tmp_path / "experiments.yaml"
    path.write_text(DEFINITIONS.read_text().replace("    seeds: [0]\n", f"    seeds: {seeds}\n", 1))
    with pytest.raises(ExperimentError) as error:
        load_definitions(path)
    assert str(error.value) == f"{path}: experiment 'smoke': {message}"


def test_a_bad_seed_stops_the_dry_run_with_one_line(tmp_path):
    path = tmp_path / "experiments.yaml"
    path.write_text(DEFINITIONS.read_text().replace("    seeds: [0]\n", "    seeds: 5\n", 1))
    dry = snakemake("--profile", "profiles/local", "-n", "--config", f"experiment_file={path}", "experiments=[mini]")
    message = f"error: {path}: experiment 'smoke': seeds must be a non-empty list of integers, got 5"
    assert dry.returncode == 2 and dry.stderr.strip().splitlines()[-1:] == [message] and "Traceback" not in dry.stderr


def test_a_duplicate_variant_is_an_error_not_an_overwrite(tmp_path):
    text = DEFINITIONS.read_text().replace(
        "      SAC-GLAM: {algorithm: sac}\n", "      SAC-GLAM: {algorithm: sac}\n      SAC-GLAM: {algorithm: ppo}\n", 1
    )
    path = tmp_path / "experiments.yaml"
    path.write_text(text)
    line = text[: text.index("SAC-GLAM: {algorithm: ppo}")].count("\n") + 1
    with pytest.raises(ExperimentError, match=re.escape(f"{path}:{line}: duplicate key experiments.main.variants.SAC")):
        load_definitions(path)


def test_workflow_configuration_is_validated():
    raw = yaml.safe_load((ROOT / "workflow" / "config" / "config.yaml").read_text())
    raw["budget"]["allocation_gpu_hours"] = "250"  # what `--config budget={...}` passes
    raw["launcher"]["container"] = "null"
    parsed = parse_workflow_config(raw)
    assert parsed.budget.allocation_gpu_hours == 250.0 and parsed.launcher.container is None
    raw["launcher"]["gpus"] = 4
    with pytest.raises(ValueError, match="launcher.gpus: Unexpected keyword argument"):
        parse_workflow_config(raw)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "launcher:\n  time_min: 20:00:00\n",
            "{path}:2: launcher.time_min: 20:00:00 is read by YAML as the base-60 number 72000; write plain minutes "
            '(1200) or quote SLURM\'s HH:MM:SS ("20:00:00")',
        ),
        (
            "launcher:\n  time_min: 20:00\n",  # "20:00" quoted would be 20 minutes to SLURM: not the advice
            "{path}:2: launcher.time_min: 20:00 is read by YAML as the base-60 number 1200; write plain minutes (1200) "
            'or quote SLURM\'s HH:MM:SS ("20:00:00") (a quoted "20:00" is 20 minutes 0 seconds to SLURM)',
        ),
        ("launcher:\n  gpus_per_node: true\n", "{path}: launcher.gpus_per_node: true is not a number (got True)"),
        ("budget:\n  allocation_gpu_hours: true\n", "{path}: budget.allocation_gpu_hours: true is not a number"),
        (
            "launcher:\n  gpus_per_node: 0\n",
            "{path}: launcher.gpus_per_node: 0: a SLURM run needs at least 1 GPU (one rank per GPU); 0 is for "
            "executor: local",
        ),
        (
            "launcher:\n  sbatch_options: {exclude: [node01, node02]}\n",
            "{path}: launcher.sbatch_options: exclude: ['node01', 'node02'] is not an sbatch option's value: one "
            'string, number or true (several nodes are one string, e.g. "node[01-02],node05")',
        ),
        (
            b"launcher:\n  partition: caf\xe9\n",
            "cluster settings file {path}:2: not UTF-8 text (byte 0xe9 at offset 26)",
        ),
        ("", "cluster settings file {path} is empty"),
        (None, "--config: cluster_file: {path} does not exist: create it (docs/cluster.md)"),
        ("launcher:\n  partition: <your GPU partition>\n", "{path}:2: launcher.partition: <your GPU partition> is a"),
        ("launcher:\n  nodes: 2\n", "{path}: launcher.nodes: a run's ranks share one node (multi-node data"),
        ("launcher:\n  gres_type: a100:4\n", "{path}: launcher.gres_type: a GRES type is one word such as a100"),
        ("launcher:\n  sbatch_options: {time: 60}\n", "{path}: launcher.sbatch_options: time: set launcher.time_min"),
        (
            "launcher:\n  sbatch_options: {job-name: x}\n",
            "{path}: launcher.sbatch_options: job-name: set nothing (the launcher names the job",
        ),
        (
            "launcher:\n  sbatch_options: {exclusive: false}\n",
            "{path}: launcher.sbatch_options: exclusive: false: leave the option out instead",
        ),
        (
            "launcher:\n  sbatch_options: {mail user: x}\n",
            "{path}: launcher.sbatch_options: 'mail user' is not an sbatch option name",
        ),
        ("launcher:\n  gpus_per_node: 2\n  gpus_per_node: 4\n", "{path}:3: duplicate key launcher.gpus_per_node"),
        (
            "budget:\n  allocation_gpu_hours: -5\n",
            "{path}: budget.allocation_gpu_hours: Input should be greater than 0",
        ),
        ("launcher:\n  time_min: 0\n", "{path}: launcher.time_min: Input should be greater than 0"),
        ("launcher:\n  gpus_per_node: -1\n", "{path}: launcher.gpus_per_node: Input should be greater than or equal"),
        ('launcher:\n  time_min: "20h"\n', "{path}: launcher.time_min: '20h' is not a SLURM time limit"),
    ],
)
def test_configuration_errors_name_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "cluster.yaml"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(WorkflowConfigError) as error:
        load_workflow_config([], {"cluster_file": str(path)})
    assert str(error.value).startswith(message.format(path=path)) and "\n" not in str(error.value)


def test_null_leaves_an_option_out_and_setup_may_be_one_line(tmp_path):
    """As the example's header says: null leaves an option out (sbatch_options' values, setup, binds too)."""
    path = tmp_path / "cluster.yaml"
    path.write_text("launcher:\n  sbatch_options: {reservation: null, exclude: node01}\n  setup: null\n  binds: null\n")
    launcher = load_workflow_config([], {"cluster_file": str(path)}).launcher
    assert (launcher.sbatch_options, launcher.setup, launcher.binds) == ({"exclude": "node01"}, (), ())
    path.write_text('launcher:\n  setup: "module load apptainer"\n')
    assert load_workflow_config([], {"cluster_file": str(path)}).launcher.setup == ("module load apptainer",)


def test_configuration_layers_and_slurm_times(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text('launcher:\n  partition: gpu\n  time_min: "20:00:00"\nbudget:\n  allocation_gpu_hours: 900\n')
    settings = load_workflow_config([], {"cluster_file": str(path), "budget": {"allocation_gpu_hours": "500"}})
    assert settings.launcher.partition == "gpu" and settings.launcher.time_min == 1200  # quoted: SLURM's format
    assert settings.budget.allocation_gpu_hours == 500  # --config wins over the cluster file
    times = ("90", "1:30", "2:00:00", "1-0", "1-02:30", "1-00:00:30")
    assert [slurm_minutes(t) for t in times] == [90, 2, 120, 1440, 1590, 1441]


def test_a_copied_profile_reads_its_own_cluster_file_and_a_missing_one_names_the_example(tmp_path):
    from conftest import copy_cluster_profile

    mine = copy_cluster_profile(tmp_path, "mycluster", partition="mine", gres_type="a100", setup=["module load x"])
    settings = load_workflow_config([mine / "workflow.yaml"], {})
    assert settings.cluster_file == f"{mine}/cluster.yaml" and settings.launcher.partition == "mine"
    assert settings.launcher.gres_type == "a100" and settings.launcher.setup == ("module load x",)
    (mine / "cluster.yaml").unlink()
    with pytest.raises(WorkflowConfigError) as error:
        load_workflow_config([mine / "workflow.yaml"], {})
    assert str(error.value) == (
        f"{mine}/workflow.yaml: cluster_file: {mine}/cluster.yaml does not exist: copy "
        f"{mine}/cluster.example.yaml to it and set its <...> values (docs/cluster.md)"
    )
    with pytest.raises(WorkflowConfigError, match=re.escape("cluster.example.yaml:9: launcher.partition: <your GPU")):
        load_workflow_config([], {"cluster_file": str(ROOT / "profiles" / "slurm" / "cluster.example.yaml")})


def test_sbatch_options_are_passed_through_under_submitits_names():
    options = {"--mail-user": "me@example.org", "exclusive": True}
    raw = {"experiments": ["main"], "launcher": {"sbatch_options": options}}
    assert parse_workflow_config(raw).launcher.sbatch_options == {"mail_user": "me@example.org", "exclusive": True}


# -- Snakemake ------------------------------------------------------------------------------------------
def snakemake(*args: str, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SNAKEMAKE, "--nolock", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_dry_run_of_the_paper_grid_lists_every_run_and_the_budget(tmp_path, cluster_profile):
    """In an environment without torch, transformers or bitsandbytes (a login node's driver-only install)."""
    env = {**no_torch_environment(tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}  # every import, on stderr
    start = time.perf_counter()
    config = ["--config", f"experiments={json.dumps(PAPER)}", f"results={tmp_path}"]
    result = snakemake("--profile", str(cluster_profile), "-n", *config, env=env)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    runs = expand(load_definitions(DEFINITIONS), PAPER, tmp_path)
    out = result.stdout + result.stderr
    assert "GPU-hour budget of Snakemake's plan: 66 train jobs (66 new)" in out
    assert out.count(f"total: {len(runs)} runs to train, 3,019.2 GPU-hours planned") == 2  # at the start and the end
    assert out.count("rule train:") == len(runs)
    assert all(str(run.directory / MARKER) in out for run in runs)
    assert "rule container:" in out  # the image is built (on the login node) before jobs use it
    assert all(f"rule aggregate_{name}:" in out for name in PAPER) and "rule goal_types:" in out
    imported = set(re.findall(r"import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", result.stderr))
    assert not [m for m in imported if m.split(".")[0] in HEAVY]  # reading the workflow stays light
    print(f"dry run of the paper grid: {seconds:.1f} s (with import profiling)")


def test_a_dry_run_on_h200s_prices_the_paper_grid_from_gpu_checks_measurement_and_the_gpus_runs_use(tmp_path):
    """budget.gpu: H200 in a copied cluster profile: the runs are priced from what gpu_check measured on an H200
    (workflow/config/gpu_rates/H200.yaml), with the paper's 4 ranks a GPU each (gpus_per_node: 4) or on one GPU
    (gpus_per_node: 1), and the budget says so; a malformed rates file is one error line."""
    from conftest import copy_cluster_profile

    config = ["--config", f"experiments={json.dumps(PAPER)}", f"results={tmp_path / 'results'}"]
    env = no_torch_environment(tmp_path)  # as on a driver-only install
    outs = {}
    for gpus in (4, 1):
        profile = copy_cluster_profile(tmp_path / str(gpus), budget={"gpu": "H200"}, gpus_per_node=gpus)
        result = snakemake("--profile", str(profile), "-n", "--quiet", "rules", *config, env=env)
        outs[gpus] = result.stdout + result.stderr
        assert result.returncode == 0, outs[gpus][-3000:]
    # experiment main: 4 seeds, GPUs per run, hours per run, attempts, GPU-hours, and where they come from
    assert re.search(r"^    SAC-GLAM\+HER +4  new +4 +0\.6 +1 +10\.3  gpu_check measured 2026-11-28$", outs[4], re.M)
    assert re.search(r"^    SAC-GLAM\+HER +4  new +1 +2\.0 +1 +7\.8  gpu_check measured 2026-11-28$", outs[1], re.M)
    assert re.search(
        r"^    PPO-GLAM +4  new +1 +1\.7 +1 +6\.9  gpu_check measured 2026-11-28, one rank per GPU's for 4$",
        outs[1],
        re.M,
    )
    assert "  gpu_check measured <date>: one process's environment steps/s on a GPU" in outs[1]
    assert outs[4].count("total: 66 runs to train, 108.3 GPU-hours planned") == 2 and "peak-ratio" not in outs[4]
    assert outs[1].count("total: 66 runs to train, 89.7 GPU-hours planned") == 2
    for out in outs.values():  # both layouts priced, each checked against the H200's memory, in either plan
        assert re.search(r"^    gpus_per_node: 4 \(a GPU per rank\) +108\.3 GPU-h, .*GiB a process: fits", out, re.M)
        assert re.search(
            r"^    gpus_per_node: 1 \(4 ranks on one GPU\) +89\.7 GPU-h, .*17\.1 GiB a process: fits", out, re.M
        )
    assert (
        "cheaper that fits: gpus_per_node: 1 (4 ranks on one GPU), not this plan's (launcher.gpus_per_node: 4)"
        in outs[4]
    )
    assert "cheaper that fits: gpus_per_node: 1, this plan's" in outs[1]
    profile = copy_cluster_profile(tmp_path, budget={"gpu": "H200"})
    # the same dry run with a calibration table whose H200 file lost a date
    table = tmp_path / "calibration.yaml"
    table.write_text((ROOT / "workflow" / "config" / "calibration.yaml").read_text())
    (tmp_path / "gpu_rates").mkdir()
    rates = (ROOT / "workflow" / "config" / "gpu_rates" / "H200.yaml").read_text()
    (tmp_path / "gpu_rates" / "H200.yaml").write_text(rates.replace("  date: 2026-11-28\n", "", 1))
    bad = snakemake("--profile", str(profile), "-n", *config, f"budget={{calibration: {table}}}", env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path}/gpu_rates/H200.yaml: measurements.0.date: Field required"
    )


def test_a_dry_run_ends_with_a_summary_per_experiment_and_every_warning(tmp_path, definitions, cluster_profile):
    """After Snakemake's last line: per experiment the runs to train, those finished and their GPU-hours, the
    total, and the warnings printed with the budget far above (the allocation's and the preflight's)."""
    runs = expand(definitions, ["main", "ppo_her"], tmp_path)
    fake_finished_run(next(r for r in runs if r.experiment == "main" and r.variant == "PPO-GLAM"))
    config = ['experiments=["main", "ppo_her"]', f"results={tmp_path}", "budget={allocation_gpu_hours: 100}",
              "launcher={partition: null}"]  # fmt: skip
    command = [*SNAKEMAKE, "--nolock", "--profile", str(cluster_profile), "-n", "--config", *config]
    result = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    start, end = result.stdout.split("This was a dry-run", 1)  # as a terminal shows Snakemake's log and ours
    end = end.splitlines()[1:]
    # 12 lines, and one more where SLURM's commands are not installed (the preflight says so)
    assert len(end) in (12, 13) and end[0] == "" and end[1].startswith("Summary of this dry run"), end
    assert end[2].split() == ["experiment", "to", "train", "finished", "GPU-h"]
    assert end[3].split() == ["main", "11", "1", "743.2"]  # one PPO-GLAM run of 34.4 GPU-hours is finished
    assert end[4].split() == ["ppo_her", "12", "0", "412.8"]
    # both layouts of the example's V100s: the peak-ratio rule prices them alike, and no peak is measured there
    assert end[5] == "  layouts of the 23 runs of 4 ranks to train (31.7 GiB a GPU):"
    assert re.match(r"    gpus_per_node: 4 \(a GPU per rank\) +1,156\.0 GPU-h, .*: fit unknown$", end[6]), end[6]
    assert re.match(
        r"    gpus_per_node: 1 \(4 ranks on one GPU\) +1,156\.0 GPU-h, .*: fit unknown  <- this plan", end[7]
    )
    assert end[8].startswith("    cheaper that fits: unknown")
    assert end[9].startswith("  total: 23 runs to train, 1,156.0 GPU-hours planned + 0.0 spent = 1,156.0 of")
    assert end[10].startswith("  WARNING: 1,156.0 GPU-hours is over the allocation of 100.0")
    assert end[11].startswith(f"  WARNING: preflight: {cluster_profile}/cluster.yaml: launcher.partition is not set")
    assert all(warning in start for warning in end[10:])  # the budget's warnings, repeated


def test_local_runs_claim_their_torch_threads_as_snakemake_cores(tmp_path, definitions):
    """A local run with threads: 2 takes both of the profile's 2 cores, so it never runs beside another."""
    changed = yaml.safe_load(DEFINITIONS.read_text())
    changed["experiments"]["smoke"]["variants"]["PPO-GLAM"]["threads"] = 2
    experiments = tmp_path / "experiments.yaml"
    experiments.write_text(yaml.safe_dump(changed))
    config = [*local_config(tmp_path, ["smoke"]), f"experiment_file={experiments}"]
    result = snakemake("--profile", "profiles/local", "-n", "--config", *config)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [block for block in result.stdout.split("rule ")[1:] if block.startswith("train:")]
    threads = {re.search(r"variant=([^,-]+(?:-GLAM)?(?:\+HER)?)", b).group(1): "threads: 2" in b for b in jobs}
    assert threads == {"PPO-GLAM": True, "SAC-GLAM": False, "SAC-GLAM+HER": False}


def test_a_setting_added_at_its_default_keeps_every_runs_fingerprint():
    """done.json and checkpoints record the configuration's fingerprint, and a run resumes only under the same
    one: adding a setting (here sac.actor_lr_ramp_updates and sac.actor_loss) must not change it. These are the
    seed-0 fingerprints of the demo as it was before those settings (now mini_paper_loss), as the code before
    them computes them."""
    runs = expand(
        load_definitions(DEFINITIONS, STUDIES), ["mini_paper_loss"], "results", {"models": "resources/models"}
    )
    assert {(run.directory.parent.name, run.config.fingerprint) for run in runs if run.config.seed == 0} == {
        ("PPO-GLAM-481d8d05", "c9e7138ecdcf4c9f"),
        ("SAC-GLAM-607efcbe", "fff84b55115a5701"),
        ("SAC-GLAM+HER-244ce11f", "b28212449c20f21d"),
    }
    for change in ({"actor_lr_ramp_updates": 10}, {"actor_loss": "forward_kl"}):
        changed = [merge(yaml.safe_load(dump_config(run.config)), {"sac": change}) for run in runs]
        assert all(parse_config(c).fingerprint != run.config.fingerprint for c, run in zip(changed, runs))


def test_every_experiment_keeps_its_run_directories(definitions):
    """A run's directory is named from its settings, and a campaign finds its finished runs by that name: moving
    an experiment between files, or rewriting its YAML anchors, must not rename a single run directory.
    tests/data/run_directories.txt lists them all (`<experiment>/<variant>-<hash>`, the models at resources/models).
    mini_ten_seeds and mini_longer are the demo as it was when they ran: the same directories as mini_tau_tuning's
    chosen variants."""
    runs = expand(definitions, list(definitions["experiments"]), "", {"models": "resources/models"})
    directories = sorted({f"{run.experiment}/{run.directory.parent.name}" for run in runs})
    assert directories == (Path(__file__).parent / "data" / "run_directories.txt").read_text().split()


def test_a_setting_added_later_leaves_finished_runs_their_fingerprints(definitions):
    """A finished run is found by its directory and trusted by the fingerprint its done.json records: a setting
    added to the configuration must leave every earlier run's fingerprint as it was (config.ADDED_LATER), or every
    finished run of a campaign reads as another configuration. tests/data/fingerprints.txt holds those of `smoke`
    and `main` as the code before `checkpoint.drill_at_steps` computed them."""
    runs = expand(definitions, ["smoke", "main"], "results", {"models": "resources/models"})
    found = [f"{run.directory} {run.config.fingerprint}" for run in runs]
    assert found == (Path(__file__).parent / "data" / "fingerprints.txt").read_text().splitlines()


def test_the_longer_experiment_is_the_ten_seed_one_at_twice_its_steps(definitions):
    """mini_longer asks whether SAC-GLAM lacks only budget: its runs must differ from the demo's of the time (as
    mini_ten_seeds keeps it) in their step budget and seeds alone, with the same claims."""

    def settings(experiment: str) -> tuple[dict[str, dict], set[int], set[int]]:
        expanded = expand(definitions, [experiment], "results", {"models": "resources/models"})
        unique = {"seed": None, "total_steps": None, "output_dir": None}
        variants = {run.variant: {**yaml.safe_load(dump_config(run.config)), **unique} for run in expanded}
        return variants, {run.seed for run in expanded}, {run.config.total_steps for run in expanded}

    demo, demo_seeds, demo_steps = settings("mini_ten_seeds")
    longer, longer_seeds, longer_steps = settings("mini_longer")
    assert longer == demo and len(demo) == 3
    assert longer_steps == {2 * step for step in demo_steps} and not longer_seeds & demo_seeds  # tuning seeds
    experiments = definitions["experiments"]
    assert (
        experiments["mini_longer"]["claims"] == experiments["mini_ten_seeds"]["claims"] == experiments["mini"]["claims"]
    )


def test_an_experiment_is_defined_in_one_file(tmp_path):
    studies = tmp_path / "studies.yaml"
    studies.write_text("experiments:\n  mini: {seeds: [0], variants: {a: {algorithm: ppo}}}\n")
    with pytest.raises(ExperimentError, match=f"^{studies}: experiment 'mini' is already defined in {DEFINITIONS}$"):
        load_definitions(DEFINITIONS, studies)
    studies.write_text("defaults: {num_envs: 8}\nexperiments: {}\n")
    with pytest.raises(ExperimentError, match=r"unknown top-level keys \['defaults'\]"):
        load_definitions(DEFINITIONS, studies)


def test_longest_runs_start_first(tmp_path, definitions):
    """Snakemake starts the SAC runs (a step costs them more than PPO's) before the PPO runs, so that the short
    runs fill the cores at the end instead of one long run finishing alone."""
    result = snakemake("--profile", "profiles/local", "-n", "--config", *local_config(tmp_path, ["smoke"]))
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [block for block in result.stdout.split("rule ")[1:] if block.startswith("train:")]
    priority = {
        re.search(r"variant=([^,]+)-[0-9a-f]{8}", b).group(1): float(re.search(r"priority: (\S+)", b).group(1))
        for b in jobs
    }
    assert set(priority) == {"PPO-GLAM", "SAC-GLAM", "SAC-GLAM+HER"}
    assert priority["PPO-GLAM"] < min(priority["SAC-GLAM"], priority["SAC-GLAM+HER"])


def test_real_launch_refuses_a_plan_above_the_allocation(tmp_path, cluster_profile):
    config = ["experiments=[main]", "budget={allocation_gpu_hours: 100}", f"results={tmp_path / 'results'}"]
    result = snakemake("--profile", str(cluster_profile), "--config", *config)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the plan needs 777.6 GPU-hours and 0.0 are already spent: 777.6 is over the allocation of "
        "100.0 (budget.allocation_gpu_hours); launch fewer experiments or seeds, or raise the allocation"
    )
    assert not (tmp_path / "results").exists()  # nothing was launched or written


def fake_finished_run(run: Run, marker: bool = True) -> None:
    """A run as the trainer leaves it when finished (metrics, config, done.json) and, optionally, its marker."""
    run.directory.mkdir(parents=True, exist_ok=True)
    rows = []
    steps = evaluation_steps(run.config)
    for i, step in enumerate(steps):
        row = dict.fromkeys(COLUMNS, "")
        row |= {"env_steps": step, "wall_seconds": 10.0 * i, "eval_success": 0.1 * i, "eval_success_test": 0.05 * i}
        rows.append(row)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(run.directory / "metrics.csv", index=False)
    (run.directory / "config.yaml").write_text(dump_config(run.config))
    summary = {
        "env_steps": steps[-1],
        "wall_seconds": 10.0 * len(steps),
        "eval_success": 0.1 * (len(steps) - 1),
        "gpus": 0,
        "fingerprint": run.config.fingerprint,
    }
    (run.directory / "done.json").write_text(json.dumps(summary))
    if marker:
        (run.directory / MARKER).write_text("{}")


def no_torch_environment(tmp_path: Path) -> dict:
    """The environment of a process that cannot import the trainer's packages (a driver-only install)."""
    blocker = tmp_path / "no-torch"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(NO_TORCH)
    return {**os.environ, "PYTHONPATH": str(blocker)}


def test_aggregation_and_status_run_without_torch(tmp_path, definitions, cluster_profile):
    runs = expand(definitions, ["main"], tmp_path)
    for run in runs:
        fake_finished_run(run)
    env = no_torch_environment(tmp_path)
    outputs = [sys.executable, "-m", "sacglam_core.reports.outputs", "main", "--results", str(tmp_path)]
    result = subprocess.run(outputs, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(path.exists() for path in expected_outputs("main", definitions["experiments"]["main"], tmp_path))
    status = [sys.executable, "-m", "sacglam_core.jobs.status", "--profile", str(cluster_profile), "main",
              "--results", str(tmp_path)]  # fmt: skip
    result = subprocess.run(status, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "main: 12 runs: 12 finished" in result.stdout, result.stderr[-3000:]


@pytest.mark.slow
def test_a_driver_only_install_plans_and_dry_runs_the_paper_grid(tmp_path):
    """`pip install '.[workflow]'` into a fresh virtualenv, as on a login node: no torch, transformers or
    bitsandbytes, and the workflow plans the paper's grid, prices it and passes its preflight's checks."""
    from conftest import copy_cluster_profile

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = [str(venv / "bin" / "pip"), "install", "--quiet", f"{ROOT}[workflow]"]
    result = subprocess.run(install, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    packages = "('torch', 'transformers', 'bitsandbytes')"
    probe = f"import importlib.util as u; print([m for m in {packages} if u.find_spec(m)])"
    assert subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True).stdout == "[]\n"
    tensorboard = [str(venv / "bin" / "tensorboard"), "--version_tb"]  # `tensorboard --logdir results` watches runs
    assert subprocess.run(tensorboard, capture_output=True, text=True, timeout=120).stdout.strip() == "2.21.0"
    profile = copy_cluster_profile(tmp_path)
    command = [str(venv / "bin" / "snakemake"), "--nolock", "--profile", str(profile), "-n", "--config",
               f"experiments={json.dumps(PAPER)}", f"results={tmp_path / 'results'}"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "total: 66 runs to train, 3,019.2 GPU-hours planned" in result.stderr


def local_config(tmp_path: Path, experiments: list[str]) -> list[str]:
    return [
        f"experiments={json.dumps(experiments)}",
        f"results={tmp_path / 'results'}",
        f"models={tmp_path / 'models'}",
        f"hf_cache={tmp_path / 'hf'}",
    ]


def smoke_runs(tmp_path: Path, definitions: dict) -> list[Run]:
    return expand(definitions, ["smoke"], tmp_path / "results", {"models": str(tmp_path / "models")})


def test_finished_runs_are_final_whatever_changes(tmp_path, definitions):
    """Touching every source file, the models and the image never plans a finished run again; a run that has
    its done.json but lost its marker (an older layout, a cleanup) costs nothing and is not trained."""
    (tmp_path / "models" / "tiny-t5").mkdir(parents=True)
    (tmp_path / "models" / "tiny-causal").mkdir()
    runs = smoke_runs(tmp_path, definitions)
    for run in runs:
        fake_finished_run(run, marker=run is not runs[0])
    time.sleep(0.05)
    for path in [*ROOT.glob("sacglam_core/**/*.py"), *ROOT.glob("workflow/**/*"), ROOT / "pyproject.toml"]:
        if path.is_file():
            os.utime(path)
    os.utime(tmp_path / "models" / "tiny-t5")
    config = local_config(tmp_path, ["smoke"])
    dry = snakemake("--profile", "profiles/local", "-n", "--config", *config)
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    assert out.count("rule train:") == 1 and str(runs[0].directory / MARKER) in out  # only the marker is missing
    assert "GPU-hour budget of Snakemake's plan: 1 train jobs (1 finished)" in out
    assert "total: 0 runs to train, 0.0 GPU-hours planned" in out
    real = snakemake("--profile", "profiles/local", "--config", *config, "--", str(runs[0].directory / MARKER))
    assert real.returncode == 0, (real.stdout + real.stderr)[-3000:]
    assert (runs[0].directory / MARKER).exists() and not (runs[0].directory / "attempts.jsonl").exists()
    again = snakemake(
        "--profile", "profiles/local", "-n", "--config", *config, "--", *[str(r.directory / MARKER) for r in runs]
    )
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "total: 0 runs to train, 0.0 GPU-hours planned" in again.stdout + again.stderr


def test_mid_campaign_figures_and_report(tmp_path, definitions):
    """One experiment finished, one not started: `figures` and `--report` work, and say what they skip."""
    for run in smoke_runs(tmp_path, definitions):
        fake_finished_run(run)
    config = local_config(tmp_path, ["smoke", "mini"])
    figures = snakemake("--profile", "profiles/local", "--config", *config, "--", "figures")
    out = figures.stdout + figures.stderr
    assert figures.returncode == 0, out[-3000:]
    assert "mini: no finished runs yet (15 planned): skipped" in out and "rule train:" not in out
    smoke = expected_outputs("smoke", definitions["experiments"]["smoke"], tmp_path / "results")
    assert all(p.exists() for p in smoke) and not (tmp_path / "results" / "mini").exists()
    report = tmp_path / "report.html"
    made = snakemake("--profile", "profiles/local", "--config", *config, "--report", str(report))
    assert made.returncode == 0, (made.stdout + made.stderr)[-3000:]
    assert "figure2.png" in report.read_text()


# Fault injection for the aggregation's own process only: writing summary.md fails as on a full disk, after the
# figures have been rewritten.
DISK_FULL_AT_SUMMARY = """
import errno, os, sys
if "sacglam_core.reports.outputs" in sys.orig_argv:
    replace = os.replace
    def failing(src, dst, *args, **kwargs):
        if str(dst).endswith("summary.md"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return replace(src, dst, *args, **kwargs)
    os.replace = failing
"""


def test_damaged_runs_and_failed_aggregations_never_cost_the_tables_already_made(tmp_path, definitions):
    """A finished run whose metrics.csv is gone is left out with one warning line on the console; an aggregation that
    fails (here a full disk halfway through) ends with one line and puts every figure and table back as it was."""
    (tmp_path / "models" / "tiny-t5").mkdir(parents=True)
    (tmp_path / "models" / "tiny-causal").mkdir()
    runs = smoke_runs(tmp_path, definitions)
    for run in runs:
        fake_finished_run(run)
    config = local_config(tmp_path, ["smoke"])
    outputs = expected_outputs("smoke", definitions["experiments"]["smoke"], tmp_path / "results")
    first = snakemake("--profile", "profiles/local", "--config", *config)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    (runs[0].directory / "metrics.csv").unlink()
    (runs[0].directory / MARKER).unlink()  # written again at once (done.json exists): the experiment is aggregated
    damaged = snakemake("--profile", "profiles/local", "--config", *config)
    out = damaged.stdout + damaged.stderr
    assert damaged.returncode == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"cannot read metrics file {runs[0].directory / 'metrics.csv'}" in warnings[0]
    assert "Traceback" not in out and "| 0/1 (1 left out) |" in (tmp_path / "results/smoke/summary.md").read_text()
    made = {path: path.read_bytes() for path in outputs}

    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(DISK_FULL_AT_SUMMARY)
    (runs[1].directory / MARKER).unlink()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "inject")}
    failed = snakemake("--profile", "profiles/local", "--config", *config, env=env)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors == ["error: smoke: cannot write its figures and tables: [Errno 28] No space left on device: "
                      f"'{tmp_path / 'results/smoke/summary.md'}'"]  # fmt: skip
    assert "Traceback" not in out and "Restored previous version" in out
    assert {path: path.read_bytes() for path in outputs} == made


@pytest.mark.slow
def test_kill_9_of_the_local_driver_then_the_same_command_resumes_every_run_once(tmp_path, tiny_models):
    """kill -9 of a local Snakemake mid-campaign: its trainers checkpoint and stop on their own; the same command
    then finishes every run from its checkpoint, never against a lease held by an orphan (about 3 minutes)."""
    longer = merge(load_definitions(DEFINITIONS), {"experiments": {"smoke": {"settings": {"total_steps": 2048}}}})
    experiment_file = tmp_path / "experiments.yaml"
    experiment_file.write_text(yaml.safe_dump(longer))
    runs = expand(longer, ["smoke"], tmp_path / "results", {"models": str(tiny_models["tiny-t5"].parent)})
    config = [f"experiment_file={experiment_file}", *local_config(tmp_path, ["smoke"])]
    config = [c if not c.startswith("models=") else f"models={tiny_models['tiny-t5'].parent}" for c in config]
    command = ["--profile", "profiles/local", "--config", *config, "--", *[str(r.directory / MARKER) for r in runs]]
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            [*SNAKEMAKE, "--nolock", *command], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 300
    while not any(list((r.directory / "checkpoints").glob("ckpt-*.json")) for r in runs if holder(r.directory)):
        assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    orphans = {r.directory: holder(r.directory)["pid"] for r in runs if holder(r.directory)}
    first.kill()  # SIGKILL to Snakemake alone: its trainers live on, re-parented
    first.wait()

    second = snakemake(*command)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert all(not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
               for pid in orphans.values())  # fmt: skip
    for run in runs:
        text = (run.directory / "trainer.log").read_text()
        assert "one trainer per run directory" not in text and "in use by" not in out
        if run.directory in orphans:
            assert "is gone: checkpointing and stopping" in text and "resumed at" in text
            assert text.index("checkpointing and stopping") < text.index("resumed at")
        done = json.loads((run.directory / "done.json").read_text())
        assert done["env_steps"] == 2048
    assert load_experiment("smoke", runs).left_out == {}  # one metrics row per evaluation: nothing trained twice


def test_preflight_refuses_to_resume_with_other_ranks(tmp_path, definitions):
    run = smoke_runs(tmp_path, definitions)[0]
    (run.directory / "checkpoints").mkdir(parents=True)
    (run.directory / "checkpoints" / "ckpt-000000512.json").write_text(json.dumps({"number": 512, "world": 4}))
    for model in ("tiny-t5", "tiny-causal"):
        (tmp_path / "models" / model).mkdir(parents=True, exist_ok=True)
    config = local_config(tmp_path, ["smoke"])
    message = f"{run.directory} was checkpointed by 4 ranks (ckpt-000000512.json) but launcher.gpus_per_node gives 1"
    dry = snakemake("--profile", "profiles/local", "-n", "--config", *config)
    assert dry.returncode == 0 and f"WARNING: preflight: {message}" in dry.stderr
    assert "GPU-hour budget of Snakemake's plan: 3 train jobs (2 new, 1 resumes)" in dry.stderr
    real = snakemake("--profile", "profiles/local", "--config", *config)
    assert real.returncode == 2 and f"error: preflight: {message}" in real.stderr
    assert not (run.directory / "attempts.jsonl").exists() and not (run.directory / "run.yaml").exists()


@pytest.mark.parametrize(
    "option, key",
    [
        (["--default-resources", "slurm_account=foo", "slurm_partition=bar"], "slurm_account: the training jobs'"),
        (["--set-resources", "train:runtime=600"], "runtime: the training jobs' SLURM options come from the cluster"),
    ],
)
def test_snakemakes_slurm_resources_are_refused_with_the_key_to_use(tmp_path, cluster_profile, option, key):
    result = snakemake("--profile", str(cluster_profile), "-n", *option, "--config", f"results={tmp_path}")
    assert result.returncode == 2 and key in result.stderr, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    expected = "launcher.account" if "slurm_account" in key else "launcher.time_min"
    assert line.endswith(f"set {expected} in {cluster_profile}/cluster.yaml")


def test_lint_is_clean(cluster_profile):
    for profile in ("profiles/local", str(cluster_profile)):
        result = snakemake("--profile", profile, "--lint")
        out = result.stdout + result.stderr
        assert "Congratulations, your workflow is in a good condition!" in out, out[-3000:]
        assert "localrules" not in out


@pytest.mark.slow  # two minutes: README's first command runs the same profile on the demo
def test_local_profile_runs_the_smoke_experiment_end_to_end(tmp_path):
    results = tmp_path / "results"
    paths = local_config(tmp_path, ["smoke"])
    result = snakemake("--profile", "profiles/local", "--config", *paths)
    assert result.returncode == 0, result.stderr[-3000:]
    definitions = load_definitions(DEFINITIONS)
    runs = expand(definitions, ["smoke"], results, {"models": str(tmp_path / "models")})
    for run in runs:
        done = json.loads((run.directory / "done.json").read_text())
        assert done["env_steps"] == run.config.total_steps
        assert (run.directory / "metrics.csv").read_text().count("\n") == 1 + run.config.total_steps // 256 + 1
        attempts = [json.loads(line) for line in (run.directory / "attempts.jsonl").read_text().splitlines()]
        assert attempts[-1]["exit_status"] == 0
    # The experiment's figures and tables, Figure 4 and the calibration.
    outputs = expected_outputs("smoke", definitions["experiments"]["smoke"], results)
    assert all(p.stat().st_size > 0 for p in outputs)
    assert (results / "figure4.png").exists() and (results / "calibration.yaml").exists()
    summary = (results / "smoke" / "summary.md").read_text()
    assert all(variant in summary for variant in ("PPO-GLAM", "SAC-GLAM", "SAC-GLAM+HER"))

    again = snakemake("--profile", "profiles/local", "--config", *paths)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # A lost run (done.json and the marker gone) is trained again, alone, from its last checkpoint, and its
    # experiment's figures and tables are made again.
    lost = runs[0].directory
    (lost / "done.json").unlink()
    (lost / MARKER).unlink()
    third = snakemake("--profile", "profiles/local", "--config", *paths)
    log = third.stdout + third.stderr
    assert third.returncode == 0, third.stderr[-3000:]
    assert log.count("rule train:") == 1 and "rule aggregate_smoke:" in log
    assert (lost / "done.json").exists() and "resumed at 1024" in (lost / "trainer.log").read_text()

    # Figures again from existing metrics, without training; then the HTML report.
    figure = results / "smoke" / "figure2.png"
    figure.unlink()
    regenerated = snakemake("--profile", "profiles/local", "--config", *paths, "--", "figures")
    assert regenerated.returncode == 0, regenerated.stderr[-3000:]
    assert figure.exists() and "rule train:" not in regenerated.stdout + regenerated.stderr
    report = tmp_path / "report.html"
    made = snakemake("--profile", "profiles/local", "--config", *paths, "--report", str(report))
    assert made.returncode == 0, made.stderr[-3000:]
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html>") and "figure2.png" in html and "summary.csv" in html


def test_models_are_staged_at_their_pinned_commit_with_only_pytorch_files(tmp_path, monkeypatch):
    import huggingface_hub

    from sacglam_core.models.hub import stage

    commit = "7bcac572ce56db69c1ea7c8af255c5d7c9672fc2"
    calls = []

    def snapshot_download(name, cache_dir, revision, allow_patterns):
        calls.append((name, revision, allow_patterns))
        snapshot = Path(cache_dir) / "models--google--flan-t5-base" / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "model.safetensors").touch()
        return str(snapshot)

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    stage("google/flan-t5-base", str(tmp_path), commit)
    ((name, revision, patterns),) = calls
    assert (name, revision) == ("google/flan-t5-base", commit) and "*.safetensors" in patterns
    assert not any(p.endswith((".h5", ".msgpack", ".onnx", ".bin")) or p == "*" for p in patterns)
    # the offline trainer loads `main`: it must be the pinned commit
    assert (tmp_path / "models--google--flan-t5-base" / "refs" / "main").read_text() == commit
    definitions = load_definitions(DEFINITIONS)
    settings = parse_workflow_config(yaml.safe_load((ROOT / "workflow" / "config" / "config.yaml").read_text()))
    hub_models = {r.config.model.name_or_path for r in expand(definitions, PAPER, "results")}
    assert hub_models <= set(settings.model_revisions)  # every staged model is pinned


def test_an_error_names_where_its_value_was_set_the_command_line_included(tmp_path):
    """`--config 'budget={gpu: B200}'` over a cluster file that says V100: the error blames --config, not the file;
    the same for a preflight warning about a command-line launcher.gpus_per_node."""
    from conftest import copy_cluster_profile

    from sacglam_core.jobs.plan import Plan
    from sacglam_core.jobs.status import profile_files

    profile = copy_cluster_profile(tmp_path)
    files = profile_files(str(profile))
    settings = load_workflow_config(files, {"budget": {"gpu": "B200"}, "results": str(tmp_path / "results")})
    with pytest.raises(ValueError) as error:
        Plan(settings, [])
    assert str(error.value).startswith("--config: budget.gpu: B200 is not a GPU of ")
    settings = load_workflow_config(files, {"launcher": {"gpus_per_node": 3}, "results": str(tmp_path / "results")})
    assert settings.origin("launcher.gpus_per_node") == "--config"
    assert settings.origin("budget.gpu") == str(profile / "cluster.yaml").removeprefix(f"{ROOT}/")
    run = next(r for r in expand(load_definitions(DEFINITIONS), ["main"], tmp_path / "results"))
    warning = Plan(settings, [run])._ranks(run)
    assert "launcher.gpus_per_node gives (--config): use a divisor of 4" in warning, warning
