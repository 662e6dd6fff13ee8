"""The LLM seen the GLAM way: scores of candidate actions given a prompt, and hidden states for heads.

`GlamLM.score` computes every prompt's candidates in one batched pass. For a seq2seq model the encoder
runs once per prompt and its output (with the decoder's cross-attention keys/values) is reused by all of
that prompt's actions; for a causal LM the prompt runs once and all of its actions attend to its
key/value cache, without a copy per action where the model allows it (`shared_prompt.py`).
`score_naive` is the reference: one full forward per (prompt, action) pair.

Several named weight sets can live beside the main one ("default"): with LoRA they are peft adapters
on the same base model, otherwise full copies. Critics and target critics use them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from sacglam_core.agent.batch import CandidateBatch, collate, pad_rows, to_device
from sacglam_core.agent.shared_prompt import SharedPrompt, shared_prompt_attention, supports_shared_prompt

DEFAULT = "default"


@dataclass
class LMOutput:
    action_logp: torch.Tensor  # [A] summed log-probability of each action's tokens (paper eq. 1)
    action_hidden: torch.Tensor | None = None  # [A, d] final hidden state at each action's last token
    prompt_hidden: torch.Tensor | None = None  # [B, d] hidden state that sees the prompt alone


class GlamLM(nn.Module):
    def __init__(self, model: nn.Module, tokenizer, architecture: str) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.architecture = architecture
        self.copies = nn.ModuleDict()  # full-weight copies, when there is no LoRA
        self.lora = hasattr(model, "peft_config")
        self._active = DEFAULT
        config = self.base_config
        self.hidden_size = config.d_model if hasattr(config, "d_model") else config.hidden_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        probe = tokenizer("x").input_ids
        self.prompt_ends_with_eos = tokenizer.eos_token_id is not None and probe[-1] == tokenizer.eos_token_id
        self.shared_prompt = not self.seq2seq and supports_shared_prompt(model)

    @property
    def base_config(self):
        return self.model.config

    @property
    def seq2seq(self) -> bool:
        return self.architecture == "seq2seq"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- weight sets -----------------------------------------------------------------------------
    def add_weights(self, name: str, source: str = DEFAULT, trainable: bool = True) -> None:
        """A new weight set `name`, initialised from `source` (an adapter, or a full copy)."""
        if self.lora:
            with self._keep_trainable_flags():
                self.model.add_adapter(name, self.model.peft_config[DEFAULT])
            for param in self.parameters_of(name):
                param.requires_grad_(trainable)
            self.polyak(source, name, tau=1.0)
        else:
            self.copies[name] = copy.deepcopy(self._module(source))
            self.copies[name].requires_grad_(trainable)

    def parameters_of(self, name: str = DEFAULT) -> list[nn.Parameter]:
        """The trainable tensors of a weight set (LoRA weights, or the whole model)."""
        if self.lora:
            tag = f".{name}."
            return [p for n, p in self.model.named_parameters() if tag in n and "lora_" in n]
        return list(self._module(name).parameters())

    @torch.no_grad()
    def polyak(self, source: str, target: str, tau: float) -> None:
        """target <- tau * source + (1 - tau) * target."""
        polyak(self.parameters_of(source), self.parameters_of(target), tau)

    @contextmanager
    def using(self, name: str) -> Iterator[None]:
        """Run the model with weight set `name` inside the block."""
        if name == self._active:
            yield
            return
        previous = self._active
        self._activate(name)
        try:
            yield
        finally:
            self._activate(previous)

    def _activate(self, name: str) -> None:
        if self.lora:
            with self._keep_trainable_flags():
                self.model.base_model.set_adapter(name)
        self._active = name

    @contextmanager
    def _keep_trainable_flags(self) -> Iterator[None]:
        # peft's set_adapter/add_adapter also flip requires_grad; the optimizers own those flags here.
        flags = {n: p.requires_grad for n, p in self.model.named_parameters()}
        yield
        for n, p in self.model.named_parameters():
            if n in flags:
                p.requires_grad_(flags[n])

    def compile_stacks(self) -> None:
        """`torch.compile` the transformer stacks of every weight set (`model.compile`): each layer's few dozen
        operator calls become a handful of compiled kernels and matrix products."""
        # One stack's code serves the encoder and the decoder, with and without cache, hidden states and gradients,
        # and each weight set: more graphs than the default limit of 8, past which it would silently run eagerly.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        # Python floats of the layers (LoRA's scaling, norms' epsilons) as constants: left dynamic, each one becomes
        # a tensor made at every call.
        torch._dynamo.config.specialize_float = True
        for model in (self.model, *self.copies.values()):
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            for stack in (base.get_encoder(), base.get_decoder()) if self.seq2seq else (base.get_decoder(),):
                stack.compile(dynamic=True)

    def _module(self, name: str) -> nn.Module:
        return self.model if name == DEFAULT or self.lora else self.copies[name]

    # -- batching --------------------------------------------------------------------------------
    def collate(self, prompts: list[list[int]], candidates: list[list[list[int]]], action_index=None) -> CandidateBatch:
        return collate(prompts, candidates, self.pad_id, not self.seq2seq, action_index, self.device)

    def _mask(self, padding: torch.Tensor, queries: int = 1, causal: bool = False, past: int = 0) -> torch.Tensor:
        """The attention mask for `queries` tokens after `past` cached ones over the keys of the 2D `padding` mask
        [N, keys], made here in the 4D form the model's attention takes (one query row serves them all when not
        `causal`): transformers, given the 2D mask, would first check whether any key is padded, a read of the
        mask that makes the host wait for the GPU at every pass, and build it in a dozen calls more."""
        implementation = self.base_config._attn_implementation
        if implementation not in ("sdpa", "eager"):
            return padding  # flash and flex attention take the 2D mask, the shared-prompt attention its own
        allowed = padding.bool()[:, None, None, :]  # [N, 1, 1, keys]
        if causal:
            keys = torch.arange(padding.shape[1], device=padding.device)
            seen = keys[None, :] <= torch.arange(past, past + queries, device=padding.device)[:, None]
            allowed = allowed & seen  # [N, 1, queries, keys]
        if implementation == "sdpa":
            return allowed
        dtype = self.model.get_input_embeddings().weight.dtype
        return torch.zeros((), dtype=dtype, device=padding.device).masked_fill(~allowed, torch.finfo(dtype).min)

    # -- forward passes --------------------------------------------------------------------------
    def score(self, batch: CandidateBatch, hidden: bool = False) -> LMOutput:
        """Scores of all candidates; with `hidden`, also the action and prompt hidden states."""
        return self._score_seq2seq(batch, hidden) if self.seq2seq else self._score_causal(batch, hidden)

    def _score_seq2seq(self, batch: CandidateBatch, hidden: bool) -> LMOutput:
        # The encoder runs once per prompt, and so does the decoder's first step (the start token), whose
        # cache then holds each prompt's cross-attention keys/values: every action of the prompt reuses
        # them instead of projecting the encoder states again.
        model = self._module(self._active)
        prompt = self._mask(batch.prompt_mask)
        encoded = model.get_encoder()(input_ids=batch.prompt_ids, attention_mask=prompt).last_hidden_state
        start = torch.full_like(batch.prompt_ids[:, :1], model.config.decoder_start_token_id)
        prefix = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
            attention_mask=prompt,
            decoder_input_ids=start,
            use_cache=True,
            output_hidden_states=hidden,
        )
        cache = prefix.past_key_values
        cache.batch_select_indices(batch.owner)
        actions = torch.cat([torch.ones_like(batch.action_mask[:, :1]), batch.action_mask], 1)  # after the start token
        out = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoded[batch.owner]),
            attention_mask=prompt[batch.owner],
            decoder_input_ids=batch.action_ids,
            decoder_attention_mask=self._mask(actions, queries=batch.action_ids.shape[1], causal=True, past=1),
            past_key_values=cache,
            output_hidden_states=hidden,
        )
        logits = torch.cat([prefix.logits[batch.owner], out.logits[:, :-1]], 1)
        logp = _token_logp(logits, batch.action_ids, batch.action_mask)
        if not hidden:
            return LMOutput(logp)
        states = out.decoder_hidden_states[-1]
        rows = torch.arange(len(states), device=states.device)
        return LMOutput(logp, states[rows, batch.action_mask.sum(1) - 1], prefix.decoder_hidden_states[-1][:, 0])

    def _score_causal(self, batch: CandidateBatch, hidden: bool) -> LMOutput:
        model = self._module(self._active)
        prompt_positions = (batch.prompt_mask.cumsum(1) - 1).clamp(min=0)
        # Logits only where a token is predicted: the prompt's last position and each action's own tokens
        # but its last (a large vocabulary makes the others a large share of the pass).
        prompt_width = batch.prompt_ids.shape[1]
        prefix = model(
            input_ids=batch.prompt_ids,
            attention_mask=self._mask(batch.prompt_mask, queries=prompt_width, causal=True),
            position_ids=prompt_positions,
            use_cache=True,
            output_hidden_states=hidden,
            logits_to_keep=1,
        )
        cache = prefix.past_key_values
        prompt_len = batch.prompt_mask.sum(1)[batch.owner]
        width = batch.action_ids.shape[1]
        action_pass = dict(
            input_ids=batch.action_ids,
            position_ids=prompt_len[:, None] + torch.arange(width, device=prompt_len.device)[None, :],
            output_hidden_states=hidden,
            logits_to_keep=torch.arange(width - 1, device=prompt_len.device),
        )
        if self.shared_prompt:  # actions attend to their prompt's keys/values where they are (shared_prompt.py)
            row, column = batch.slots()
            shared = SharedPrompt(
                [layer.keys for layer in cache.layers],
                [layer.values for layer in cache.layers],
                batch.prompt_mask.bool(),
                batch.action_mask.bool(),
                row,
                column,
                batch.max_candidates,
            )
            with shared_prompt_attention(model):
                out = model(**action_pass, attention_mask=batch.action_mask, use_cache=False, shared_prompt=shared)
        else:
            cache.batch_select_indices(batch.owner)  # one copy of each prompt's keys/values per action
            mask = torch.cat([batch.prompt_mask[batch.owner], batch.action_mask], 1)
            mask = self._mask(mask, queries=width, causal=True, past=prompt_width)
            out = model(**action_pass, attention_mask=mask, past_key_values=cache)
        logits = torch.cat([prefix.logits[batch.owner], out.logits], 1)
        logp = _token_logp(logits, batch.action_ids, batch.action_mask)
        if not hidden:
            return LMOutput(logp)
        states = out.hidden_states[-1]
        rows = torch.arange(len(states), device=states.device)
        return LMOutput(logp, states[rows, batch.action_mask.sum(1) - 1], prefix.hidden_states[-1][:, -1])

    def concat_hidden(self, batch: CandidateBatch) -> torch.Tensor:
        """[A, d] the paper's critic input: the LLM reads prompt + action, one sequence per action.

        For a seq2seq model the encoder reads the concatenation and the decoder's first hidden state
        summarises it; for a causal LM, the last token's hidden state does.
        """
        model = self._module(self._active)
        prompts = [batch.prompt_tokens[i] for i in batch.owners()]
        if self.seq2seq:
            eos = [self.tokenizer.eos_token_id] if self.prompt_ends_with_eos else []
            rows = [(p[:-1] if eos else p) + a + eos for p, a in zip(prompts, batch.action_tokens)]
            ids, mask = to_device(list(pad_rows(rows, self.pad_id)), self.device)
            start = torch.full_like(ids[:, :1], model.config.decoder_start_token_id)
            mask = self._mask(mask)
            out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=start, output_hidden_states=True)
            return out.decoder_hidden_states[-1][:, 0]
        rows = [p + a for p, a in zip(prompts, batch.action_tokens)]
        ids, mask = to_device(list(pad_rows(rows, self.pad_id, left=True)), self.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        mask = self._mask(mask, queries=ids.shape[1], causal=True)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
        return out.hidden_states[-1][:, -1]

    def score_naive(self, prompts: list[list[int]], candidates: list[list[list[int]]]) -> torch.Tensor:
        """Reference scores: one unpadded forward per (prompt, action) pair. [A]"""
        model = self._module(self._active)
        scores = []
        for prompt_ids, actions in zip(prompts, candidates):
            for action in actions:
                p = torch.tensor([prompt_ids], device=self.device)
                a = torch.tensor([action], device=self.device)
                if self.seq2seq:
                    start = torch.full_like(a[:, :1], model.config.decoder_start_token_id)
                    logits = model(input_ids=p, decoder_input_ids=torch.cat([start, a[:, :-1]], 1)).logits
                else:
                    logits = model(input_ids=torch.cat([p, a], 1)).logits[:, p.shape[1] - 1 : -1]
                scores.append(_token_logp(logits, a, torch.ones_like(a))[0])
        return torch.stack(scores)


@torch.no_grad()
def polyak(sources: list[torch.Tensor], targets: list[torch.Tensor], tau: float) -> None:
    """targets <- tau * sources + (1 - tau) * targets, in one call for all of them."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source tensors for {len(targets)} targets")
    torch._foreach_lerp_(targets, [s if s.dtype == t.dtype else s.to(t.dtype) for s, t in zip(sources, targets)], tau)


def _token_logp(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each row of log p(token) where mask is 1. logits [A, L, V], tokens/mask [A, L]."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # at least fp32 for the log-softmax
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return (picked * mask).sum(-1)
