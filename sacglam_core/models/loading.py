"""Load a Hugging Face seq2seq or causal LM (hub id or local folder), optionally 4-bit and with LoRA."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel

from sacglam_core.config import LoraSettings, ModelConfig
from sacglam_core.device_plan import DevicePlan
from sacglam_core.models.hub import hub_offline

# On CPUs with AVX512-BF16 (Intel Xeon), bitsandbytes tries an optional kernel package (`kernels`) for 4-bit products
# and warns at import when it is missing; its own fallback computes the same products, so the warning only worries
# every trainer.log.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

Architecture = Literal["seq2seq", "causal"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = [
    "LoraSettings",
    "ModelConfig",
    "ModelNotFoundError",
    "add_lora",
    "load_model",
    "load_tokenizer",
    "lora_target_modules",
]


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor in the Hugging Face cache (and cannot be downloaded)."""


# A tokenizer's vocabulary is in one of these (fast tokenizers, sentencepiece, BPE, WordPiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)


def _folder_problem(name: str) -> str | None:
    """What a local model folder lacks (None when it looks complete)."""
    folder = Path(os.path.expanduser(name))
    if not folder.is_dir():
        return f"there is no model folder at {name!r}"
    if not (folder / "config.json").is_file():
        return f"the model folder {name!r} has no config.json"
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        return f"the model folder {name!r} has no weights (*.safetensors or *.bin)"
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return f"the model folder {name!r} has no tokenizer vocabulary (none of {', '.join(TOKENIZER_FILES)})"
    return None


def _check_folder(config: ModelConfig) -> None:
    """An existing local folder that lacks files is named with what it lacks (a T5 config without
    tokenizer files would otherwise load a tokenizer with an empty vocabulary)."""
    name = config.name_or_path
    problem = _folder_problem(name) if config.is_local_path and Path(os.path.expanduser(name)).is_dir() else None
    if problem:
        raise ModelNotFoundError(
            f"cannot load the model: {problem}. Save the complete model there (`save_pretrained` of the model and its "
            f"tokenizer); tiny models are built offline with `python -m sacglam_core.tiny build-tiny <dir>`"
        )


def _not_found(config: ModelConfig, cause: Exception) -> ModelNotFoundError:
    name = config.name_or_path
    if config.is_local_path:
        where = _folder_problem(name) or f"the model folder {name!r} cannot be loaded"
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
        f"`python -m sacglam_core.tiny build-tiny <dir>`. ({type(cause).__name__}: {cause})"
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
    _check_folder(config)
    try:
        return AutoTokenizer.from_pretrained(
            os.path.expanduser(config.name_or_path), cache_dir=config.cache_dir, local_files_only=hub_offline()
        )
    except (OSError, ValueError) as error:
        raise _not_found(config, error) from error


def load_model(config: ModelConfig) -> tuple[PreTrainedModel, Architecture]:
    """The model (peft-wrapped when LoRA is on) and its architecture.

    Every weight that is not 4-bit or a LoRA adapter is in the compute dtype, except T5's feed-forward output `wo`
    under fp16, which transformers keeps in float32 against fp16 overflow (Flan-T5) and never quantises: under bf16
    it is a bf16 linear (a 4-bit `wo` would get its input cast to the weights' uint8 storage by T5's forward)."""
    _check_folder(config)
    architecture = resolve_architecture(config)
    auto = AutoModelForSeq2SeqLM if architecture == "seq2seq" else AutoModelForCausalLM
    dtype = DTYPES[DevicePlan.of_model(config).dtype]
    kwargs: dict = {"dtype": dtype, "cache_dir": config.cache_dir, "local_files_only": hub_offline()}
    if config.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
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
    if config.dequantize_4bit:
        model = _dequantized(model, dtype)
    if config.lora is not None:
        model = add_lora(model, config, architecture)
    if next(model.parameters()).device.type == "cuda":
        # float32 products (the adapters, heads and float32 runs) on TF32 tensor cores, unless `model.tf32` is off
        torch.backends.cuda.matmul.allow_tf32 = config.tf32
        torch.backends.cudnn.allow_tf32 = config.tf32
    return model, architecture


def _fix_cpu_4bit_backward(model: torch.nn.Module) -> None:
    """On CPUs with AVX512-BF16, bitsandbytes repacks 4-bit weights after a no_grad eval forward and then
    runs a kernel without backward, so LoRA silently gets no gradient. Turning that fast path off avoids
    it (and is faster). See tests/test_models.py::test_4bit_lora_gets_gradients_after_no_grad_rollout."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def _dequantized(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """The model with each 4-bit layer replaced by a frozen dense one holding its dequantized weights in `dtype`
    (what bitsandbytes computes at every pass), and `dequantized_4bit` naming them with their quantisation."""
    import bitsandbytes as bnb

    quantized = {
        name: str(m.weight.quant_type) for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)
    }
    model = model.dequantize(dtype=dtype)
    for name in quantized:
        model.get_submodule(name).requires_grad_(False)
    model.dequantized_4bit = quantized
    return model


def add_lora(model: PreTrainedModel, config: ModelConfig, architecture: Architecture):
    """The model wrapped by peft with the LoRA adapters `config.lora` describes (float32, peft's
    `autocast_adapter_dtype`), the base model frozen by peft.

    Not peft's `prepare_model_for_kbit_training` for 4-bit models: it casts every weight that is not 4-bit to float32
    (embeddings, norms, T5's position bias, the LM head), which under bf16 put the residual stream, attention, T5's
    `wo` and the LM head in float32: 28% of the matrix-product FLOPs at Flan-T5-base's shape, 1.2% (the adapters')
    without it (`python -m sacglam_core.benchmarks.census --precision`). Its other steps are for gradient
    checkpointing, which is off here. T5's norms compute their statistics in float32 whatever the weights' dtype."""
    from peft import LoraConfig, TaskType, get_peft_model

    lora = config.lora
    targets = lora.target_modules
    if targets is not None and not isinstance(targets, str):
        targets = list(targets)
    peft_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        task_type=TaskType.SEQ_2_SEQ_LM if architecture == "seq2seq" else TaskType.CAUSAL_LM,
    )
    return get_peft_model(model, peft_config)


def adapter_norm(model: PreTrainedModel) -> float | None:
    """The norm of the LoRA adapters' B matrices, which peft starts at zero: above 0 once the adapters trained."""
    found = [p.detach().float().norm() ** 2 for name, p in model.named_parameters() if ".lora_B." in name]
    return float(torch.stack(found).sum().sqrt()) if found else None


def hub_commit(config: ModelConfig) -> str | None:
    """The commit of a hub model's files in the cache it loads from (the staged snapshot); None for a local folder."""
    if Path(config.name_or_path).expanduser().exists():
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(config.name_or_path, "config.json", cache_dir=config.cache_dir)
    return Path(found).parent.name if isinstance(found, str) else None


def lora_target_modules(model: PreTrainedModel) -> list[str] | None:
    """The kinds of module (last name part) the LoRA adapters sit on, as peft resolved them; None without LoRA."""
    config = getattr(model, "peft_config", {}).get("default")
    return None if config is None else sorted({name.rsplit(".", 1)[-1] for name in config.target_modules})


# What transformers loads for PyTorch: config, tokenizer and safetensors weights (PyTorch .bin files only when a
# model has no safetensors); never the TensorFlow, Flax or ONNX copies that hub repositories also hold.
