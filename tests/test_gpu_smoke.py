"""The first job's checks (sacglam_core/jobs/gpu_smoke.py): on run directories as a cluster job leaves them, each
check failing alone on what it checks; and on real runs of a tiny model staged as the hub model at its pinned commit,
each check that a CPU can run passing, and failing on a broken setup (adapters the actor never trains, a model read
online, a resume that does not match)."""

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading

import pytest

from sacglam_core.config import dump_config, load_config
from sacglam_core.jobs import gpu_smoke
from sacglam_core.jobs.launch import record_attempt
from sacglam_core.models.hub import stage_folder
from tests.tiny_runs import write_config

HUB_ID = "google/flan-t5-base"
COMMIT = "7bcac572ce56db69c1ea7c8af255c5d7c9672fc2"
PINNED = {HUB_ID: COMMIT}
IMAGE = {"path": "/scratch/sacglam/resources/sacglam.sif"} | {
    f"{kind}_sha256": sha for kind, sha in gpu_smoke.repository_image().items()
}
GOOD = {
    "env_steps": 1024,
    "container": IMAGE["path"],
    "image": IMAGE,
    "model_commit": COMMIT,
    "model_network": [],
    "gpus": 1,
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "device_plan": {"device": "cuda:0", "capability": [9, 0], "dtype": "bfloat16"},
    "dtype": "bfloat16",
    "weights": {
        "4bit_layers": 96,
        "quant_types": ["nf4"],
        "4bit_compute_dtypes": ["bfloat16"],
        "embedding_dtype": "bfloat16",
    },
    "optimizers": {
        "actor": {"steps": 20, "lora_tensors": 48, "lora_moment_norm": 3.1e-4},
        "critic": {"steps": 28, "lora_tensors": 96, "lora_moment_norm": 8.2e-3},
    },
    "resumes": [{"env_steps": 512, "saved": 1234.5678, "loaded": 1234.5678}],
}
ATTEMPTS = [
    {"job_id": "4242", "exit_status": 75, "restart_count": 0},
    {"job_id": "4242", "exit_status": 0, "restart_count": 1},
]
MODEL = {"name_or_path": HUB_ID, "lora": {}, "load_in_4bit": True}


def run_dir(tmp_path, done=GOOD, attempts=ATTEMPTS, model=MODEL):
    (tmp_path / "done.json").write_text(json.dumps(done))
    settings = {
        "algorithm": "sac",
        "model": model,
        "total_steps": 1024,
        "checkpoint": {"drill_at_steps": 512},
        "her": {"enabled": True},
    }
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(settings))
    config.write_text(dump_config(load_config(config)))
    (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    return tmp_path


def verdicts(results) -> dict:
    return {name: passed for name, passed, _ in results}


def test_a_job_that_ran_as_a_campaign_runs_passes_every_check(tmp_path):
    results = gpu_smoke.checks(run_dir(tmp_path), PINNED, container=IMAGE["path"])
    assert list(verdicts(results)) == [
        "image",
        "staged model",
        "GPU",
        "dtype",
        "LoRA trained",
        "checkpoint and requeue",
    ]
    assert all(passed for _, passed, _ in results), results


def fp16_on_a_v100(done: dict) -> dict:
    weights = done["weights"] | {"4bit_compute_dtypes": ["float16"], "embedding_dtype": "float16"}
    return done | {"device_plan": {"device": "cuda:0", "capability": [7, 0]}, "dtype": "float16", "weights": weights}


@pytest.mark.parametrize(
    "change, attempts, failing",
    [
        ({"image": IMAGE | {"definition_sha256": "0" * 64}}, ATTEMPTS, "image"),  # another image
        ({"image": None, "container": None}, ATTEMPTS, "image"),  # an image configured, the run outside it
        ({"model_commit": "0" * 40}, ATTEMPTS, "staged model"),
        ({"model_network": ["socket.getaddrinfo huggingface.co"]}, ATTEMPTS, "staged model"),  # read online
        ({"model_network": None}, ATTEMPTS, "staged model"),  # not recorded
        ({"gpus": 0, "gpu_name": None, "device_plan": {"device": "cpu", "capability": None}, "dtype": "float32",
          "weights": {"4bit_layers": 96, "4bit_compute_dtypes": ["float32"], "embedding_dtype": "float32"}},
         ATTEMPTS, "GPU"),  # on a CPU
        ({"dtype": "float16"}, ATTEMPTS, "dtype"),  # fp16 on an sm_90 GPU, where auto is bf16
        ({"weights": GOOD["weights"] | {"4bit_layers": 0, "4bit_compute_dtypes": []}}, ATTEMPTS, "dtype"),  # not 4-bit
        ({"weights": GOOD["weights"] | {"4bit_compute_dtypes": ["float32"]}}, ATTEMPTS, "dtype"),
        ({"weights": GOOD["weights"] | {"embedding_dtype": "float32"}}, ATTEMPTS, "dtype"),
        ({"optimizers": GOOD["optimizers"] | {"actor": {"steps": 0, "lora_tensors": 48, "lora_moment_norm": 0.0}}},
         ATTEMPTS, "LoRA trained"),  # the critic alone moved the shared adapters
        ({"optimizers": GOOD["optimizers"] | {"actor": {"steps": 20, "lora_tensors": 48, "lora_moment_norm": 0.0}}},
         ATTEMPTS, "LoRA trained"),  # the actor stepped with no gradient reaching its adapters
        ({"optimizers": GOOD["optimizers"] | {"actor": {"steps": 20, "lora_tensors": 0, "lora_moment_norm": 0.0}}},
         ATTEMPTS, "LoRA trained"),  # frozen adapters: none in the actor's optimizer
        ({}, [{"job_id": "4242", "exit_status": 0, "restart_count": 0}], "checkpoint and requeue"),  # no drill
        ({}, [{"job_id": "1", "exit_status": 75, "restart_count": 0}, {"job_id": "2", "exit_status": 0,
              "restart_count": 0}], "checkpoint and requeue"),  # a new job, not a requeue
        ({"resumes": [{"env_steps": 256, "saved": 1.5, "loaded": 1.5}]}, ATTEMPTS, "checkpoint and requeue"),
        ({"resumes": [{"env_steps": 512, "saved": 1.5, "loaded": 1.25}]}, ATTEMPTS, "checkpoint and requeue"),
        ({"resumes": []}, ATTEMPTS, "checkpoint and requeue"),
    ],
)  # fmt: skip
def test_each_check_fails_alone_on_what_it_checks(tmp_path, change, attempts, failing):
    results = gpu_smoke.checks(run_dir(tmp_path, GOOD | change, attempts), PINNED, container=IMAGE["path"])
    assert [name for name, passed, _ in results if passed is False] == [failing], results


def test_float16_is_right_on_a_v100_and_bfloat16_there_is_wrong(tmp_path):
    v100 = fp16_on_a_v100(GOOD)
    assert verdicts(gpu_smoke.checks(run_dir(tmp_path, v100), PINNED, IMAGE["path"]))["dtype"] is True
    bf16 = v100 | {"dtype": "bfloat16"}
    assert verdicts(gpu_smoke.checks(run_dir(tmp_path, bf16), PINNED, IMAGE["path"]))["dtype"] is False


def test_outside_an_image_the_image_check_is_not_run_never_passed(tmp_path):
    outside = GOOD | {"image": None, "container": None}
    assert verdicts(gpu_smoke.checks(run_dir(tmp_path, outside), PINNED, container=None))["image"] is None


# -- real runs of a tiny model staged as the hub model ---------------------------------------------------------------
SMOKE = {
    "algorithm": "sac",
    "her": {"enabled": True},
    "sac": {"batch_size": 16, "update_every": 16, "warmup_cycles": 1, "critic": {"hidden_units": 32}},
    "total_steps": 128,
    "eval": {"every_steps": 64, "episodes_per_type": 2, "test_episodes": 2},
    "checkpoint": {"every_updates": 1, "drill_at_steps": 64},
}


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The Hub's answers to a download's HEAD requests: every staged file at the pinned commit (the cached copy is
    current), nothing else (transformers' optional files): a model read online, on loopback."""

    files: set[str] = set()

    def do_HEAD(self):  # noqa: N802
        name = self.path.rsplit("/", 1)[-1]
        if name in self.files:
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{name}"')
            self.send_header("Content-Length", "1")
        else:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub_cache(tiny_models, tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-cache")
    stage_folder(tiny_models["tiny-t5"], HUB_ID, cache, COMMIT)
    return cache


def smoke_run(tmp_path, hub_cache, env=None, before_resume=None, **settings):
    """The drill's two attempts of a tiny gpu_smoke run (the second resumes), recorded as the launcher records them."""
    config = write_config(
        tmp_path / "run.yaml", HUB_ID, **(SMOKE | settings), model={"cache_dir": str(hub_cache), "lora": {"r": 4}}
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    for expected in (75, 0):
        process = subprocess.run(
            [sys.executable, "-m", "sacglam_core.train", "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
        )
        assert process.returncode == expected, process.stderr[-3000:]
        # a log line says something of the run: no library's loading bar or deprecation of its own
        assert "Loading weights" not in process.stderr and "Warning" not in process.stderr, process.stderr[-3000:]
        record_attempt(tmp_path / "out", f"local-{os.getpid()}", 1, process.returncode)
        if before_resume and expected == 75:
            before_resume(tmp_path / "out")
    return tmp_path / "out"


def test_a_cpu_run_passes_every_check_a_cpu_can_and_fails_the_gpus(tmp_path, hub_cache):
    out = smoke_run(tmp_path, hub_cache)
    results = gpu_smoke.checks(out, PINNED, container=None)
    assert verdicts(results) == {
        "image": None,
        "staged model": True,
        "GPU": False,
        "dtype": True,  # float32: what auto computes in on a CPU
        "LoRA trained": True,
        "checkpoint and requeue": True,
    }, results
    found = dict((name, text) for name, _, text in results)
    assert "read offline: no connection attempted" in found["staged model"]
    assert "resumed at step 64 (the drill's: 64)" in found["checkpoint and requeue"]


def test_adapters_the_actor_never_trained_fail_though_the_critic_moved_them(tmp_path, hub_cache):
    out = smoke_run(tmp_path, hub_cache, sac=SMOKE["sac"] | {"warmup_cycles": 10**6})  # the actor never steps
    done = json.loads((out / "done.json").read_text())
    assert done["lora_b_norm"] > 0  # what the check used to read: the critic's loss alone moved the shared adapters
    assert verdicts(gpu_smoke.checks(out, PINNED))["LoRA trained"] is False


def test_a_model_read_online_fails_though_it_is_the_pinned_commit(tmp_path, hub_cache):
    FakeHub.files = {p.name for p in (hub_cache / "models--google--flan-t5-base" / "snapshots" / COMMIT).iterdir()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        out = smoke_run(tmp_path, hub_cache, env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint})
    finally:
        server.shutdown()
    results = verdicts(gpu_smoke.checks(out, PINNED))
    assert json.loads((out / "done.json").read_text())["model_commit"] == COMMIT
    assert results["staged model"] is False and results["checkpoint and requeue"] is True


def test_a_resume_from_another_checkpoint_than_the_drills_fails(tmp_path, hub_cache):
    def lose_the_newest_checkpoint(out):
        newest = sorted((out / "checkpoints").glob("ckpt-*.json"))[-1]
        for path in (out / "checkpoints").glob(f"{newest.stem}*"):
            path.unlink()

    out = smoke_run(tmp_path, hub_cache, before_resume=lose_the_newest_checkpoint)
    results = gpu_smoke.checks(out, PINNED)
    assert verdicts(results)["checkpoint and requeue"] is False, results


def test_without_a_profile_it_checks_the_run_of_the_campaigns_own_profile(tmp_path, monkeypatch, capsys):
    """After `cp -r profiles/slurm profiles/mine` (its own cluster file, its own results folder), `gpu_smoke` alone
    reads that profile, as `status` does, not profiles/slurm; a run not there yet says which command shows it."""
    from sacglam_core.jobs.status import settings_of
    from sacglam_core.pipeline.experiments import expand, load_definitions

    results = tmp_path / "scratch" / "results"
    for name in ("slurm", "mine"):
        profile = tmp_path / "profiles" / name
        profile.mkdir(parents=True)
        (profile / "config.yaml").write_text("configfile: workflow.yaml\n")
        (profile / "workflow.yaml").write_text("cluster_file: cluster.yaml\nexperiments: [gpu_smoke]\n")
    (tmp_path / "profiles" / "mine" / "cluster.yaml").write_text(
        f"results: {results}\nlauncher: {{executor: local, container: null}}\n"
    )
    shutil.copytree(gpu_smoke.ROOT / "workflow" / "config", tmp_path / "workflow" / "config")  # a checkout's
    monkeypatch.chdir(tmp_path)
    assert gpu_smoke.main([]) == 2
    assert capsys.readouterr().err.startswith(f"error: {results}/gpu_smoke/")  # the profile's run, not finished
    settings = settings_of("profiles/mine", {})
    (run,) = expand(load_definitions(*settings.definition_files), ["gpu_smoke"], results, {"models": "."})
    run.directory.mkdir(parents=True)
    run_dir(run.directory, GOOD | {"image": None, "container": None}, model=run.settings["model"])
    assert gpu_smoke.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run.directory}:\nNOT RUN  image: ran outside an image") and out.count("\nPASS  ") == 5
