"""The compute dtype holds for the products and the frozen weights, with and without 4-bit weights."""

import pytest
import torch

from sacglam_core.benchmarks.census import float32_matmul_share
from sacglam_core.config import LoraSettings, ModelConfig
from sacglam_core.models.loading import load_model


def frozen_float32(path: str, dtype: str, load_in_4bit: bool) -> set[str]:
    model, _ = load_model(ModelConfig(path, dtype=dtype, lora=LoraSettings(), load_in_4bit=load_in_4bit))
    return {name for name, p in model.named_parameters() if not p.requires_grad and p.dtype == torch.float32}


@pytest.mark.parametrize("load_in_4bit", [True, False])
def test_bf16_runs_its_products_and_frozen_weights_in_bf16(tiny_models, load_in_4bit):
    """Only the float32 LoRA adapters' products (r=16 on a d_model of 128 here) stay float32; peft's
    prepare_model_for_kbit_training left a third of them there with 4-bit weights."""
    path = str(tiny_models["tiny-t5"])
    assert float32_matmul_share(path, load_in_4bit=load_in_4bit) <= 0.10
    assert frozen_float32(path, "bfloat16", load_in_4bit) == set()


def test_fp16_keeps_only_t5s_feed_forward_output_in_float32(tiny_models):
    """transformers keeps T5's `wo` in float32 under fp16, against overflow in Flan-T5; nothing else is upcast."""
    upcast = frozen_float32(str(tiny_models["tiny-t5"]), "float16", load_in_4bit=True)
    assert upcast and all(name.endswith(".wo.weight") for name in upcast)


def test_float32_loading_is_what_peft_prepared_before(tiny_models):
    """peft's prepare_model_for_kbit_training, which 4-bit loading called before, would change no weight of a float32
    model (it casts 16-bit weights only); loading on the CPU leaves TF32 as it was."""
    from peft import prepare_model_for_kbit_training

    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    config = ModelConfig(str(tiny_models["tiny-t5"]), dtype="float32", lora=LoraSettings(), load_in_4bit=True)
    model, _ = load_model(config)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == tf32
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    weights = {name: (p.dtype, p.data_ptr()) for name, p in model.named_parameters()}
    prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    assert {name: (p.dtype, p.data_ptr()) for name, p in model.named_parameters()} == weights


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loading_on_a_gpu_sets_tf32_as_the_model_settings_say(tiny_models):
    """`model.tf32: false` (node_check's float32 comparisons) leaves float32 products exact on a GPU."""
    kept = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for tf32 in (False, True):
            load_model(ModelConfig(str(tiny_models["tiny-t5"]), dtype="float32", device="cuda", tf32=tf32))
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = kept
