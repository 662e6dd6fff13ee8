"""Model loading, the tiny models, LoRA and 4-bit."""

import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from sacglam_core.agent import GlamLM
from sacglam_core.agent.policy import CandidateDistribution
from sacglam_core.agent.tokens import PromptTokens
from sacglam_core.config import LoraSettings, ModelConfig, parse_config
from sacglam_core.cpu import KERNELS
from sacglam_core.envs import VectorPlayground, prompt
from sacglam_core.models.loading import (
    ModelNotFoundError,
    load_model,
    load_tokenizer,
    lora_target_modules,
)
from sacglam_core.models.tokenizer import build_tokenizer
from sacglam_core.tiny import build as tiny
from sacglam_core.tiny.build import (
    SHIPPED,
    TINY_CAUSAL,
    TINY_PRETRAINED,
    ShippedWeightsError,
    TinySpec,
    build_pretrained,
    pretrain_language,
    pretrain_prior,
    sha256,
    tiny_causal,
    tiny_t5,
)
from sacglam_core.tiny.corpus import corpus


def load_lm(path, **options) -> GlamLM:
    config = ModelConfig(path, **options)
    model, architecture = load_model(config)
    return GlamLM(model, load_tokenizer(config), architecture)


def env_batch(lm: GlamLM, n=8, seed=0):
    envs = VectorPlayground(n, seed=seed)
    obs, infos = envs.reset()
    tokens = PromptTokens(lm.tokenizer)
    return lm.batch(
        [tokens.prompt(g, o) for g, o in zip(infos["goal"], obs)],
        [tokens.actions(a) for a in infos["possible_actions"]],
    )


def test_tokenizer_covers_the_environment_and_composes_prompts():
    tokenizer = build_tokenizer(add_eos=True)
    assert tokenizer.unk_token_id not in tokenizer("Goal: Grow any living_thing then grasp blue carnivorous").input_ids
    tokens = PromptTokens(tokenizer)
    obs = "You see: red dog\nYou are on: nothing\nYou are holding: nothing\nYou have grown: nothing"
    assert tokens.prompt("Grasp red dog", obs) == tokenizer(prompt("Grasp red dog", obs)).input_ids


def test_tiny_build_is_deterministic():
    spec = TinySpec(prior_steps=3)
    states = []
    for _ in range(2):
        torch.manual_seed(spec.seed)
        tokenizer = build_tokenizer(add_eos=True)
        model = tiny_t5(len(tokenizer), spec)
        pretrain_prior(model, tokenizer, spec)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_tiny_build_gives_the_same_bytes_in_another_process(tiny_models, tmp_path):
    """The command a user runs, with the default thread count and kernels: multi-threaded float reductions would
    differ between processes, and AVX-512 kernels from the AVX2 ones that the session's fixture was built with."""
    unset = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", *KERNELS)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    command = [sys.executable, "-m", "sacglam_core.tiny", "build-tiny", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, env=env)
    for name in ("tiny-t5", "tiny-causal"):
        ours, theirs = tmp_path / name / "model.safetensors", tiny_models[name] / "model.safetensors"
        assert ours.read_bytes() == theirs.read_bytes(), name


def kernels_of_this_cpu() -> list[str]:
    """The ATen kernels this CPU can run, from the oldest instruction set to its best."""
    order = ["default", "avx2", "avx512"]
    best = torch.backends.cpu.get_cpu_capability().lower()
    return order[: order.index(best) + 1] if best in order else ["default"]


def test_every_kernel_of_the_cpu_builds_the_same_models(tiny_models, tmp_path):
    """The demo's causal LMs are the shipped bytes whatever kernels a process runs; their folders (config, tokenizer)
    are the same files too."""
    folders = []
    for kernel in kernels_of_this_cpu():
        env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel}
        command = [sys.executable, "-m", "sacglam_core.tiny", "build-pretrained", str(tmp_path / kernel)]
        subprocess.run(command, check=True, capture_output=True, env=env)
        folders.append(tmp_path / kernel / TINY_PRETRAINED)
    for folder in folders:
        assert sha256(folder / "model.safetensors") == SHIPPED[TINY_PRETRAINED], folder
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (folder / name).read_bytes() == (folders[0] / name).read_bytes(), (folder, name)
    assert sha256(tiny_models[TINY_CAUSAL] / "model.safetensors") == SHIPPED[TINY_CAUSAL]


@pytest.mark.parametrize("damage", ["flipped byte", "missing"])
def test_a_damaged_shipped_file_stops_the_build_in_one_line(tmp_path, monkeypatch, capsys, damage):
    from sacglam_core.tiny.__main__ import main

    weights = tmp_path / "weights"
    shutil.copytree(tiny.WEIGHTS, weights)
    monkeypatch.setattr(tiny, "WEIGHTS", weights)
    for command, name in (("build-pretrained", TINY_PRETRAINED), ("build-tiny", TINY_CAUSAL)):
        target = weights / f"{name}.safetensors"
        pristine = target.read_bytes()
        if damage == "missing":
            target.unlink()
        else:
            target.write_bytes(pristine[:100] + bytes([pristine[100] ^ 1]) + pristine[101:])
        assert main([command, str(tmp_path / "models")]) == 1
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and str(target) in error and "git checkout" in error
        assert ("SHA-256" in error) == (damage == "flipped byte")
        assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())  # nothing written
        target.write_bytes(pristine)
    target = weights / f"{TINY_PRETRAINED}.safetensors"
    target.unlink()
    with pytest.raises(ShippedWeightsError):
        build_pretrained(tmp_path / "models")


def test_language_pretraining_is_reproducible():
    spec = TinySpec(lm_epochs=1, lm_batch=16)
    lines = corpus(spec.seed)[:64]
    states = []
    for _ in range(2):
        torch.manual_seed(spec.seed)
        tokenizer = build_tokenizer(add_eos=False, extra=lines)
        model = tiny_causal(len(tokenizer), spec)
        pretrain_language(model, tokenizer, lines, spec)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.slow
def test_pretrained_build_gives_the_same_bytes_in_two_processes_at_once(tmp_path):
    """The training build (`--train`), twice at once with the default thread count (about 10 minutes on 2 cores): the
    same weights in both, and the same other files as the shipped build's."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    builds = [
        subprocess.Popen(
            [sys.executable, "-m", "sacglam_core.tiny", "build-pretrained", str(tmp_path / str(i)), "--train"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [build.communicate()[0] for build in builds]
    assert all(build.returncode == 0 for build in builds), logs
    assert "nats per token" in logs[0]
    first, second = (tmp_path / str(i) / TINY_PRETRAINED for i in range(2))
    for name in ("model.safetensors", "tokenizer.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    shipped = build_pretrained(tmp_path / "shipped")
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (shipped / name).read_bytes(), name


def test_tiny_models_load_offline_and_start_near_the_uniform_policy(tiny_path):
    lm = load_lm(tiny_path)
    assert lm.architecture == ("seq2seq" if "t5" in tiny_path else "causal")
    batch = env_batch(lm, n=16)
    with torch.no_grad():
        policy = CandidateDistribution.from_scores(lm.score(batch).action_logp, batch)
    uniform_entropy = policy.mask.sum(1).float().log()
    assert (uniform_entropy - policy.entropy()).mean() < 0.05


def test_tiny_t5_output_layer_is_not_saturated():
    """transformers 5 ties T5's output layer to its embeddings; the tiny build must stay well-scaled."""
    torch.manual_seed(0)
    tokenizer = build_tokenizer(add_eos=True)
    model = tiny_t5(len(tokenizer), TinySpec()).eval()
    ids = torch.randint(4, len(tokenizer), (4, 20))
    with torch.no_grad():
        probs = model(input_ids=ids, decoder_input_ids=ids[:, :5]).logits.softmax(-1)
    assert probs.max(-1).values.mean() < 0.5


def test_missing_local_model_names_the_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no model folder at .*nowhere.*stage"):
        load_model(ModelConfig(str(tmp_path / "nowhere")))


@pytest.mark.parametrize(
    "missing, message",
    [
        ("tokenizer.json", "has no tokenizer vocabulary (none of tokenizer.json, "),
        ("config.json", "has no config.json"),
        ("model.safetensors", "has no weights"),
    ],
)
def test_incomplete_model_folder_names_what_is_missing(tmp_path, tiny_models, missing, message):
    folder = tmp_path / "model"
    shutil.copytree(tiny_models["tiny-t5"], folder)
    (folder / missing).unlink()
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelNotFoundError, match=f"the model folder '{folder}' {re.escape(message)}"):
            load(ModelConfig(str(folder)))


def test_missing_hub_model_offline_says_how_to_stage(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as error:
        load_model(ModelConfig("google/flan-t5-base", cache_dir=str(tmp_path)))
    message = str(error.value)
    assert "'google/flan-t5-base' is not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message and "python -m sacglam_core.models stage google/flan-t5-base" in message


def test_bad_model_options_are_rejected():
    with pytest.raises(ValueError, match="load_in_4bit needs model.lora"):
        ModelConfig("x", load_in_4bit=True)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig("x", dtype="float8")


def test_4bit_compute_dtype_follows_the_dtype(tiny_models):
    import bitsandbytes as bnb

    for dtype, expected in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        lm = load_lm(str(tiny_models["tiny-t5"]), dtype=dtype, lora=LoraSettings(r=4), load_in_4bit=True)
        quantized = [m for m in lm.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert quantized and {m.compute_dtype for m in quantized} == {expected}


def test_dtype_option(tiny_path):
    lm = load_lm(tiny_path, dtype="bfloat16")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    batch = env_batch(lm, n=2)
    with torch.no_grad():
        assert torch.isfinite(lm.score(batch).action_logp).all()


def test_lora_trains_only_adapters(tiny_path):
    lm = load_lm(
        tiny_path,
        lora=LoraSettings(
            r=4, alpha=8, dropout=0.0, target_modules=("q", "v") if "t5" in tiny_path else ("q_proj", "v_proj")
        ),
    )
    trainable = {n for n, p in lm.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {p.data_ptr() for p in lm.parameters_of()} == {
        p.data_ptr() for n, p in lm.model.named_parameters() if p.requires_grad
    }


def adapted_modules(lm: GlamLM) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in lm.model.named_modules() if hasattr(module, "lora_A")}


def test_lora_defaults_to_the_first_authors_query_and_value(tiny_path):
    """MAGELLAN (magellan/initializer.py): r=16, alpha=32, dropout 0, T5's `q` and `v` (`q_proj`, `v_proj`
    for causal LMs), which is peft's own default per architecture."""
    lora = LoraSettings()
    assert (lora.r, lora.alpha, lora.dropout, lora.target_modules) == (16, 32, 0.0, None)
    lm = load_lm(tiny_path, lora=lora)
    expected = ["q", "v"] if "t5" in tiny_path else ["q_proj", "v_proj"]
    assert adapted_modules(lm) == set(expected) and lora_target_modules(lm.model) == expected
    every_linear = load_lm(tiny_path, lora=LoraSettings(target_modules="all-linear"))
    assert adapted_modules(every_linear) > set(expected)


def test_4bit_lora_gets_gradients_after_no_grad_rollout(tiny_path):
    """The AVX512-BF16 pitfall: a no_grad eval forward must not cut LoRA off from its gradients."""
    import bitsandbytes as bnb

    lm = load_lm(tiny_path, lora=LoraSettings(r=4), load_in_4bit=True)
    quantized = [m for m in lm.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.support_avx512bf16_for_cpu is False for m in quantized)
    batch = env_batch(lm)
    lm.model.eval()
    with torch.no_grad():  # the rollout
        lm.score(batch)
    lm.model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "an autograd kernel was not registered"
        loss = CandidateDistribution.from_scores(lm.score(batch).action_logp, batch).entropy().mean()
        loss.backward()
    lora_b = [p for n, p in lm.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)


def scores_and_adapter_grads(lm: GlamLM) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's scores of a batch and the gradient of their sum on the adapters' B, from adapters drawn alike."""
    torch.manual_seed(0)
    for name, p in lm.model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(p, std=0.1)  # peft starts B at 0, which would leave A without gradient
    scores = lm.score(env_batch(lm)).action_logp
    scores.sum().backward()
    grads = torch.cat([p.grad.flatten().float() for n, p in lm.model.named_parameters() if "lora_B" in n])
    return scores.detach().float(), grads


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_4bit_weights_dequantized_once_hold_the_4bit_values_and_compute_as_well(tiny_models, dtype):
    """`model.dequantize_4bit`: each 4-bit layer becomes a frozen dense one holding exactly what bitsandbytes
    dequantizes at every pass. In float32 the scores and the adapters' gradients are the 4-bit model's, bit for bit;
    in bfloat16 peft adds a dense layer's float32 adapter output before rounding, a 4-bit layer's after, so both are
    judged against float32 on the same weights: the dense one no farther from it than the 4-bit one (+25%). done.json's
    record says which layers were 4-bit and what they compute in."""
    import bitsandbytes as bnb

    from sacglam_core.provenance import weights_record

    path = str(tiny_models["tiny-t5"])
    four_bit = load_lm(path, dtype=dtype, lora=LoraSettings(r=4), load_in_4bit=True)
    dense = load_lm(path, dtype=dtype, lora=LoraSettings(r=4), load_in_4bit=True, dequantize_4bit=True)
    layers = dict(dense.model.named_modules())
    quantized = {n: m for n, m in four_bit.model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized and not any(isinstance(m, bnb.nn.Linear4bit) for m in layers.values())
    for name, module in quantized.items():
        values = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
        weight = layers[name].weight
        assert torch.equal(weight, values.to(getattr(torch, dtype))) and not weight.requires_grad
    assert [n for n, p in dense.model.named_parameters() if p.requires_grad] == [
        n for n, p in four_bit.model.named_parameters() if p.requires_grad
    ]
    record = weights_record(dense.model)
    assert record == weights_record(four_bit.model) | {"4bit_dequantized_once": True}
    assert record["4bit_layers"] == len(quantized) and record["4bit_compute_dtypes"] == [dtype]
    (four_bit_scores, four_bit_grads), (scores, grads) = map(scores_and_adapter_grads, (four_bit, dense))
    if dtype == "float32":
        assert torch.equal(scores, four_bit_scores) and torch.equal(grads, four_bit_grads)
    else:
        dense.model.float()  # the same weights, computed in float32
        exact_scores, exact_grads = scores_and_adapter_grads(dense)
        for ours, theirs, exact in ((scores, four_bit_scores, exact_scores), (grads, four_bit_grads, exact_grads)):
            assert (ours - exact).norm() <= 1.25 * (theirs - exact).norm()
    with pytest.raises(ValueError, match="dequantize_4bit needs model.load_in_4bit"):
        ModelConfig(path, lora=LoraSettings(), dequantize_4bit=True)
    paper = {"algorithm": "sac", "model": {"name_or_path": path, "lora": {}, "load_in_4bit": True}}
    once = {**paper, "model": {**paper["model"], "dequantize_4bit": True}}
    assert parse_config(once).fingerprint == parse_config(paper).fingerprint  # the same weights: no run re-runs


def test_bitsandbytes_missing_optional_cpu_kernel_says_nothing():
    """bitsandbytes warns on CPUs with AVX512-BF16 that an optional kernel package is missing, though its fallback
    computes the same products: loading silences that logger, so trainer.log does not start with a false alarm."""
    import logging

    import sacglam_core.models.loading  # noqa: F401

    assert logging.getLogger("bitsandbytes.backends.cpu.ops").getEffectiveLevel() == logging.ERROR
