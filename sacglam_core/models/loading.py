"""Load a Hugging Face seq2seq or causal LM (hub id or local folder), optionally 4-bit and with LoRA."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel

from sacglam_core.config import LoraSettings, ModelConfig

Architecture = Literal["seq2seq", "causal"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = ["LoraSettings", "ModelConfig", "ModelNotFoundError", "load_model", "load_tokenizer", "stage"]


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor in the Hugging Face cache (and cannot be downloaded)."""


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def _not_found(config: ModelConfig, cause: Exception) -> ModelNotFoundError:
    name = config.name_or_path
    if config.is_local_path:
        where = f"there is no model folder at {name!r}"
    else:
        cache = (
            config.cache_dir or os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
        )
        where = f"{name!r} is not in the Hugging Face cache ({cache})" + (
            " and HF_HUB_OFFLINE is set" if hub_offline() else ""
        )
    return ModelNotFoundError(
        f"model not found: {where}. Stage it on a machine with internet access with "
        f"`python -m sacglam_core.models stage {name} --cache-dir <shared cache>` and point HF_HOME "
        f"(or model.cache_dir) at that cache; tiny models are built offline with "
        f"`python -m sacglam_core.models build-tiny <dir>`. ({type(cause).__name__}: {cause})"
    )


def resolve_architecture(config: ModelConfig) -> Architecture:
    if config.architecture != "auto":
        return config.architecture
    try:
        hf_config = AutoConfig.from_pretrained(
            os.path.expanduser(config.name_or_path), cache_dir=config.cache_dir, local_files_only=hub_offline()
        )
    except (OSError, ValueError) as error:
        raise _not_found(config, error) from error
    return "seq2seq" if hf_config.is_encoder_decoder else "causal"


def load_tokenizer(config: ModelConfig):
    try:
        return AutoTokenizer.from_pretrained(
            os.path.expanduser(config.name_or_path), cache_dir=config.cache_dir, local_files_only=hub_offline()
        )
    except (OSError, ValueError) as error:
        raise _not_found(config, error) from error


def load_model(config: ModelConfig) -> tuple[PreTrainedModel, Architecture]:
    """The model (peft-wrapped when LoRA is on) and its architecture."""
    architecture = resolve_architecture(config)
    auto = AutoModelForSeq2SeqLM if architecture == "seq2seq" else AutoModelForCausalLM
    kwargs: dict = {"dtype": DTYPES[config.dtype], "cache_dir": config.cache_dir, "local_files_only": hub_offline()}
    if config.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["device_map"] = {"": config.device}
    try:
        model = auto.from_pretrained(os.path.expanduser(config.name_or_path), **kwargs)
    except (OSError, ValueError) as error:
        raise _not_found(config, error) from error
    if not config.load_in_4bit:
        model.to(config.device)
    if config.load_in_4bit:
        _fix_cpu_4bit_backward(model)
    if config.lora is not None:
        model = _add_lora(model, config, architecture)
    return model, architecture


def _fix_cpu_4bit_backward(model: torch.nn.Module) -> None:
    """On CPUs with AVX512-BF16, bitsandbytes repacks 4-bit weights after a no_grad eval forward and then
    runs a kernel without backward, so LoRA silently gets no gradient. Turning that fast path off avoids
    it (and is faster). See tests/test_models.py::test_4bit_lora_gets_gradients_after_no_grad_rollout."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def _add_lora(model: PreTrainedModel, config: ModelConfig, architecture: Architecture):
    from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training

    if config.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = config.lora
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type=TaskType.SEQ_2_SEQ_LM if architecture == "seq2seq" else TaskType.CAUSAL_LM,
    )
    return get_peft_model(model, peft_config)


# What transformers loads for PyTorch: config, tokenizer and safetensors weights (PyTorch .bin files only when a
# model has no safetensors); never the TensorFlow, Flax or ONNX copies that hub repositories also hold.
STAGED_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "tokenizer*"]
STAGED_BIN_FILES = ["pytorch_model*.bin", "pytorch_model*.bin.index.json"]


def stage(name: str, cache_dir: str | None, revision: str | None = None) -> str:
    """Download a hub model (its PyTorch files) into a (shared) cache, for compute nodes that run offline.

    With `revision` (a commit), that commit is downloaded and the cache's `main` points to it, so that the
    offline trainer, which loads `main`, gets exactly the pinned files. Returns the snapshot's path.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.file_download import repo_folder_name

    from sacglam_core.atomic import write_text

    if hub_offline():
        raise RuntimeError("HF_HUB_OFFLINE is set: staging needs the Hub (run it on a login node with internet)")
    path = snapshot_download(name, cache_dir=cache_dir, revision=revision, allow_patterns=STAGED_FILES)
    if not any(Path(path).glob("*.safetensors")):
        path = snapshot_download(name, cache_dir=cache_dir, revision=revision, allow_patterns=STAGED_BIN_FILES)
    if revision:
        refs = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model") / "refs"
        refs.mkdir(parents=True, exist_ok=True)
        write_text(refs / "main", Path(path).name)  # the snapshot folder is named by its commit
    return path
