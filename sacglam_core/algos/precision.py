"""Loss scaling for fp16 compute: the LLM runs in fp16 while the weights that train (LoRA adapters,
heads) stay fp32, so small gradients would underflow in the fp16 backward without it."""

from __future__ import annotations

import torch

from sacglam_core.agent import GlamAgent


def grad_scaler(agent: GlamAgent) -> torch.amp.GradScaler:
    """A GradScaler for one optimizer: enabled when the agent computes in fp16, a pass-through otherwise."""
    return torch.amp.GradScaler(agent.lm.device.type, enabled=agent.compute_dtype == "float16")
