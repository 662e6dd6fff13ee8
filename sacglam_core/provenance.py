"""What a run records in done.json about where it ran and what it trained, for the first job's checks
(jobs/gpu_smoke.py): the image, the weights as they were loaded, and each optimizer's own steps on the adapters."""

from __future__ import annotations

import math

import torch

from sacglam_core.models.hub import hub_offline
from sacglam_core.models.loading import adapter_norm, lora_target_modules


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weights_record(model: torch.nn.Module) -> dict:
    """How the LLM's weights were loaded: its 4-bit layers (bitsandbytes' Linear4bit, or dense ones holding their
    dequantized weights: `model.dequantize_4bit`), their quantisation and the dtype they compute in, and the input
    embedding's dtype (the compute dtype of the weights that are not 4-bit)."""
    dequantized = getattr(model, "dequantized_4bit", {})
    if dequantized:
        layers = [model.get_submodule(name) for name in dequantized]
        quant_types = set(dequantized.values())
        computes = {_dtype(m.weight.dtype) for m in layers}
    else:
        try:
            import bitsandbytes as bnb

            layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        except ImportError:
            layers = []
        quant_types = {str(m.weight.quant_type) for m in layers}
        computes = {_dtype(m.compute_dtype) for m in layers if m.compute_dtype is not None}
    return {
        "4bit_layers": len(layers),
        "4bit_dequantized_once": bool(dequantized),
        "quant_types": sorted(quant_types),
        "4bit_compute_dtypes": sorted(computes),
        "embedding_dtype": _dtype(model.get_input_embeddings().weight.dtype),
    }


def optimizer_record(model: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer]) -> dict:
    """Each optimizer's steps and Adam's first moment on the LoRA adapters it trains: above 0 only where its own
    loss's gradients reached them. (The adapters' norm cannot tell: a critic that shares the actor's adapters moves
    them with the actor's update broken.)"""
    names = {id(p): name for name, p in model.named_parameters()}
    record = {}
    for name, optimizer in optimizers.items():
        lora = [p for group in optimizer.param_groups for p in group["params"] if ".lora_" in names.get(id(p), "")]
        states = [optimizer.state.get(p, {}) for p in lora]
        steps = max((int(float(s["step"])) for s in states if "step" in s), default=0)
        square = sum(float(s["exp_avg"].double().square().sum()) for s in states if "exp_avg" in s)
        record[name] = {"steps": steps, "lora_tensors": len(lora), "lora_moment_norm": math.sqrt(square)}
    return record


def run_record(agent: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer]) -> dict:
    """Settings resolved at run time (the hyperparameter tables read them): LoRA's modules and how far its adapters
    moved, the commit of a hub model's files at load time, whether the Hub was offline, how the weights were loaded
    and each optimizer's steps on the adapters."""
    model = agent.lm.model
    return {
        "lora_target_modules": lora_target_modules(model),
        "lora_b_norm": adapter_norm(model),
        "model_commit": agent.source.commit,
        "hub_offline": hub_offline(),
        "weights": weights_record(model),
        "optimizers": optimizer_record(agent, optimizers),
    }


def weights_checksum(agent: torch.nn.Module) -> float:
    """A checksum of the trained weights (the ranks' must agree; a resume compares the loaded with the saved)."""
    with torch.no_grad():
        return sum(float(v.double().sum()) for v in agent.mutable_state_dict().values() if v.is_floating_point())
