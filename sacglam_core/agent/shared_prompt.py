"""Attention of candidate actions to their prompt's keys and values, without a copy per action.

A causal LM scores A actions of B prompts by running each prompt once and letting its actions attend to
the prompt's key/value cache. Handing that cache to the model's usual attention means expanding it to
one row per action and concatenating the action's own keys to it: two copies of [A, heads, prompt, d]
per layer, forward and backward, which was 30% of a mini SAC update (torch.profiler's operator table). Here the
softmax runs over both parts at once instead: the queries of each prompt's actions are laid out side by
side, [B, heads, candidates * action_len, d], so that one batched product reads each prompt's keys
once; the actions' own causal part is a small [A, heads, action_len, action_len] product. Only scores
and queries move between the two layouts, and those are action_len / d the size of the cache.

The same mathematics as the cache path: exact softmax attention over the prompt's tokens followed by
the action's own tokens up to the current one (tests/test_agent.py compares both, and their gradients).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface

NAME = "glam_shared_prompt"


@dataclass
class SharedPrompt:
    """Each layer's prompt keys/values [B, kv_heads, Lp, d]; the actions are the prompts' C candidate slots in
    order, A = B * C."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    prompt_mask: torch.Tensor  # [B, Lp] bool
    action_mask: torch.Tensor  # [A, La] bool
    slots: int  # C


# Attention variants this function does not compute: they keep the cache path.
UNSUPPORTED = ("sliding_window", "attn_logit_softcapping", "use_sliding_window")


def supports_shared_prompt(model: nn.Module) -> bool:
    """Whether the model's attention is plain softmax attention called through transformers'
    AttentionInterface (Llama, Qwen2, GPT-NeoX and most causal LMs)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (hasattr(base, "_can_set_attn_implementation") and base._can_set_attn_implementation()):
        return False
    return not any(getattr(base.config, option, None) for option in UNSUPPORTED)


@contextmanager
def shared_prompt_attention(model: nn.Module) -> Iterator[None]:
    """Run the model's attention layers with `shared_prompt_attention_forward` inside the block."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous


def shared_prompt_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    shared_prompt: SharedPrompt | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [A, H, La, d], key/value [A, Hkv, La, d] of the action tokens; returns [A, La, H, d]."""
    if shared_prompt is None:
        raise ValueError(f"attention '{NAME}' needs the `shared_prompt` keyword: use GlamLM.score")
    if dropout or any(kwargs.get(option) is not None for option in ("sliding_window", "softcap", "s_aux")):
        raise ValueError(f"attention '{NAME}' computes plain softmax attention without dropout, not this layer's")
    s = shared_prompt
    prompt_keys, prompt_values = s.keys[module.layer_idx], s.values[module.layer_idx]
    actions, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads  # query heads per key/value head (grouped-query attention)
    prompts, _, prompt_len, _ = prompt_keys.shape
    n = s.slots * group * width  # queries per prompt and key/value head, in the side-by-side layout

    def side_by_side(x: torch.Tensor) -> torch.Tensor:  # [A, Hkv, group * La, k] -> [B, Hkv, n, k]
        return x.reshape(prompts, s.slots, *x.shape[1:]).transpose(1, 2).reshape(prompts, kv_heads, n, x.shape[-1])

    def per_action(x: torch.Tensor) -> torch.Tensor:  # [B, Hkv, n, k] -> [A, Hkv, group * La, k]
        x = x.reshape(prompts, kv_heads, s.slots, group * width, x.shape[-1]).transpose(1, 2)
        return x.reshape(actions, kv_heads, group * width, x.shape[-1])

    query = query.reshape(actions, kv_heads, group * width, dim)
    to_prompt = side_by_side(query) @ prompt_keys.transpose(-1, -2) * scaling  # [B, Hkv, n, Lp]
    to_prompt = to_prompt.masked_fill(~s.prompt_mask[:, None, None, :], float("-inf"))
    to_self = query @ key.transpose(-1, -2) * scaling  # [A, Hkv, group * La, La]
    causal = torch.ones(width, width, dtype=torch.bool, device=query.device).tril()
    allowed = causal[None, :, :] & s.action_mask[:, None, :]  # [A, La (query), La (key)]
    allowed = allowed[:, None, None].expand(actions, 1, group, width, width).reshape(actions, 1, group * width, width)
    to_self = to_self.masked_fill(~allowed, float("-inf"))
    # One softmax over prompt and own tokens.
    weights = torch.cat([to_prompt, side_by_side(to_self)], -1).softmax(-1)
    out = per_action(weights[..., :prompt_len] @ prompt_values) + per_action(weights[..., prompt_len:]) @ value
    return out.reshape(actions, heads, width, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, shared_prompt_attention_forward)
