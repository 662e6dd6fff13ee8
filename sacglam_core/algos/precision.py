"""How the algorithms step their weights: Adam, and loss scaling for fp16 compute (the LLM runs in fp16 while the
weights that train, LoRA adapters and heads, stay fp32, so small gradients would underflow in the fp16 backward
without it)."""

from __future__ import annotations

import torch

from sacglam_core.agent import GlamAgent


def grad_scaler(agent: GlamAgent) -> torch.amp.GradScaler:
    """A GradScaler for one optimizer: enabled where the device plan scales losses (fp16), a pass-through otherwise."""
    return torch.amp.GradScaler(agent.lm.device.type, enabled=agent.plan.loss_scaling)


def adam(params: list[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam's fused kernel: one call steps every tensor, where the default path makes about ten per tensor and
    reads each tensor's step counter back to the host (the same numbers: tests/test_algos.py). On a GPU it may be
    captured in a CUDA graph (agent/static.py): its step counters live on the device and its learning rate is a
    tensor, which a scheduler changes in place between replays."""
    device = params[0].device
    if device.type == "meta":  # step_cost counts FLOPs on shapes alone, never steps
        return torch.optim.Adam(params, lr=lr)
    if device.type == "cuda":
        return torch.optim.Adam(params, lr=torch.tensor(lr, device=device), fused=True, capturable=True)
    return torch.optim.Adam(params, lr=lr, fused=True)


def step(
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    params: list[torch.Tensor],
    max_norm: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """After a backward pass (of the scaled loss): unscale, clip the gradients' norm to `max_norm` (None: no clipping),
    step. Returns the norm before clipping and whether float16's scaler skipped the step because a gradient
    overflowed (1, then the scale shrinks; 0 otherwise), as device tensors: nothing is read on the host."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    if not scaler.is_enabled():
        optimizer.step()
        return norm, torch.zeros((), device=norm.device)
    scale = scaler._scale.clone()  # noqa: SLF001 (the scale only shrinks after a skipped step)
    scaler.step(optimizer)
    scaler.update()
    return norm, (scaler._scale < scale).to(norm.dtype)  # noqa: SLF001
