"""The LLM seen the GLAM way: scores of candidate actions given a prompt, and hidden states for heads.

`GlamLM.score` computes every prompt's candidates in one batched pass over a batch of static shapes (batch.py).
For a seq2seq model the encoder runs once per prompt and the decoder reads each prompt's actions side by side in
one row, so that the prompt's cross-attention keys/values are projected once for all of them; for a causal LM the
prompt runs once and all of its actions attend to its key/value cache, without a copy per action where the model
allows it (`shared_prompt.py`). `score_naive` is the reference: one full forward per (prompt, action) pair.

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
from transformers.modeling_layers import GradientCheckpointingLayer

from sacglam_core.agent.batch import CandidateBatch, HostBatch, Shapes, collate
from sacglam_core.agent.shared_prompt import SharedPrompt, shared_prompt_attention, supports_shared_prompt
from sacglam_core.agent.static import stage

DEFAULT = "default"


@dataclass
class LMOutput:
    action_logp: torch.Tensor  # [B, C] summed log-probability of each action's tokens (paper eq. 1)
    action_hidden: torch.Tensor | None = None  # [B, C, d] final hidden state at each action's last token
    prompt_hidden: torch.Tensor | None = None  # [B, d] hidden state that sees the prompt alone


class GlamLM(nn.Module):
    def __init__(self, model: nn.Module, tokenizer, architecture: str, shapes: Shapes | None = None) -> None:
        super().__init__()
        self.model = model
        self.shapes = shapes or Shapes()
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
        # T5's positions are relative (a bias on the distance between two tokens): several actions decoded side by
        # side in one row each see what they would see alone. Absolute positions (BART) would not.
        self.packs_actions = self.seq2seq and getattr(config, "relative_attention_num_buckets", None) is not None

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

    def compile_blocks(self) -> None:
        """`torch.compile` each transformer block (`model.compile`, regional compilation): a block's few dozen
        operator calls become a handful of fused kernels. Batches have static shapes, so each kind of block compiles
        once per shape, gradient mode and weight set, and the repeated blocks of a stack share that code."""
        # Encoder and decoder blocks (the first with its position bias), with and without gradients, for each weight
        # set and shape: more graphs than the default limit of 8, past which it would silently run eagerly.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 4096)
        # Python floats of the layers (LoRA's scaling, norms' epsilons) as constants: left dynamic, each one becomes
        # a tensor made at every call.
        torch._dynamo.config.specialize_float = True
        for model in (self.model, *self.copies.values()):
            for module in model.modules():
                if isinstance(module, GradientCheckpointingLayer):  # transformers' repeated block of every model
                    module.compile(dynamic=False, fullgraph=True)

    def _module(self, name: str) -> nn.Module:
        return self.model if name == DEFAULT or self.lora else self.copies[name]

    # -- batching --------------------------------------------------------------------------------
    def collate(
        self,
        prompts: list[list[int]],
        candidates: list[list[list[int]]],
        action_index=None,
        concat: bool = False,
        slots: int | None = None,
    ) -> HostBatch:
        """A batch's arrays in this run's static shapes; with `concat`, the paper's critic's rows too."""
        rule = self.concat_tokens if concat else None
        return collate(prompts, candidates, self.pad_id, not self.seq2seq, action_index, self.shapes, rule, slots)

    def batch(
        self, prompts: list[list[int]], candidates: list[list[list[int]]], action_index=None, concat: bool = False
    ) -> CandidateBatch:
        """A batch on the device."""
        host = self.collate(prompts, candidates, action_index, concat)
        return host.on(stage(host.arrays, self.device).tensors)

    def concat_tokens(self, prompt: list[int], action: list[int]) -> list[int]:
        """The paper's critic input, prompt + action as one sequence; a seq2seq prompt's end-of-sequence token
        moves after the action."""
        if self.seq2seq and self.prompt_ends_with_eos:
            return prompt[:-1] + action + prompt[-1:]
        return prompt + action

    def _mask(self, padding: torch.Tensor, queries: int = 1, causal: bool = False, past: int = 0) -> torch.Tensor:
        """The attention mask for `queries` tokens after `past` cached ones over the keys of the 2D `padding` mask
        [N, keys], made here in the 4D form the model's attention takes (one query row serves them all when not
        `causal`): transformers, given the 2D mask, would first check whether any key is padded, a read of the
        mask that makes the host wait for the GPU at every pass, and build it in a dozen calls more."""
        if self.base_config._attn_implementation not in ("sdpa", "eager"):
            return padding  # flash and flex attention take the 2D mask, the shared-prompt attention its own
        allowed = padding.bool()[:, None, None, :]  # [N, 1, 1, keys]
        if causal:
            keys = torch.arange(padding.shape[1], device=padding.device)
            seen = keys[None, :] <= torch.arange(past, past + queries, device=padding.device)[:, None]
            allowed = allowed & seen  # [N, 1, queries, keys]
        return self._attention_form(allowed)

    def _attention_form(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean 4D mask as the attention takes it: boolean for SDPA, additive for eager attention."""
        if self.base_config._attn_implementation == "sdpa":
            return allowed
        dtype = self.model.get_input_embeddings().weight.dtype
        return torch.zeros((), dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)

    def _packed_mask(self, seen: torch.Tensor) -> torch.Tensor:
        """The decoder's self-attention mask when each prompt's C actions are decoded side by side in one row of
        C segments of W tokens: a token reads the tokens of its own segment up to itself that exist (`seen`
        [B, C, W]; a segment's first token, the start token, always does). T5's relative position bias depends on
        the distance between two tokens alone, so a segment's attention is that of its action decoded alone."""
        batch, slots, width = seen.shape
        position = torch.arange(slots * width, device=seen.device)
        segment = position // width
        block = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
        return self._attention_form((block[None] & seen.reshape(batch, 1, slots * width).bool())[:, None])

    # -- forward passes --------------------------------------------------------------------------
    def score(self, batch: CandidateBatch, hidden: bool = False) -> LMOutput:
        """Scores of all candidates; with `hidden`, also the action and prompt hidden states."""
        return self._score_seq2seq(batch, hidden) if self.seq2seq else self._score_causal(batch, hidden)

    def _score_seq2seq(self, batch: CandidateBatch, hidden: bool) -> LMOutput:
        # The encoder runs once per prompt. Each action is decoded as the start token and its tokens but the last (the
        # last too when the hidden state after it is read). With relative positions (T5), the decoder reads each
        # prompt's actions side by side in one row (`_packed_mask`), so that each layer projects the prompt's
        # cross-attention keys/values once for all of them; otherwise one row per action, each with a copy of its
        # prompt's encoding.
        model = self._module(self._active)
        batch_size, slots, action_width = batch.action_ids.shape
        width = action_width + 1 if hidden else action_width
        prompt = self._mask(batch.prompt_mask)
        encoded = model.get_encoder()(input_ids=batch.prompt_ids, attention_mask=prompt).last_hidden_state
        start = torch.full_like(batch.action_ids[..., :1], model.config.decoder_start_token_id)
        inputs = torch.cat([start, batch.action_ids[..., : width - 1]], -1)
        seen = torch.cat([torch.ones_like(start), batch.action_mask[..., : width - 1]], -1)
        if self.packs_actions:
            decoder_inputs = dict(
                input_ids=inputs.reshape(batch_size, slots * width), attention_mask=self._packed_mask(seen)
            )
        else:
            rows = batch_size * slots
            encoded, prompt = encoded.repeat_interleave(slots, 0), prompt.repeat_interleave(slots, 0)
            causal = self._mask(seen.reshape(rows, width), queries=width, causal=True)
            decoder_inputs = dict(input_ids=inputs.reshape(rows, width), attention_mask=causal)
        states = model.get_decoder()(
            **decoder_inputs, encoder_hidden_states=encoded, encoder_attention_mask=prompt, use_cache=False
        ).last_hidden_state.reshape(batch_size, slots, width, -1)
        logp = _token_logp(self._seq2seq_logits(states[:, :, :action_width]), batch.action_ids, batch.action_mask)
        if not hidden:
            return LMOutput(logp)
        last = batch.action_mask.sum(-1)[..., None, None].expand(-1, -1, 1, states.shape[-1])
        return LMOutput(logp, states.gather(2, last).squeeze(2), states[:, 0, 0])

    def _seq2seq_logits(self, states: torch.Tensor) -> torch.Tensor:
        """The LM head on decoder states, as the model's own forward applies it (T5 scales the states when its head
        is tied to the embeddings; BART-like models add a bias)."""
        model = self._module(self._active)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if getattr(base.config, "scale_decoder_outputs", False):
            states = states * base.model_dim**-0.5
        logits = base.get_output_embeddings()(states)
        bias = getattr(base, "final_logits_bias", None)
        return logits if bias is None else logits + bias.to(logits.dtype)

    def _score_causal(self, batch: CandidateBatch, hidden: bool) -> LMOutput:
        model = self._module(self._active)
        batch_size, slots, action_width = batch.action_ids.shape
        prompt_width = batch.prompt_ids.shape[1]
        # Logits only where a token is predicted: the prompt's last position and each action's own tokens
        # but its last (a large vocabulary makes the others a large share of the pass).
        prefix = model(
            input_ids=batch.prompt_ids,
            attention_mask=self._mask(batch.prompt_mask, queries=prompt_width, causal=True),
            position_ids=(batch.prompt_mask.cumsum(1) - 1).clamp(min=0),
            use_cache=True,
            output_hidden_states=hidden,
            logits_to_keep=1,
        )
        cache = prefix.past_key_values
        actions = batch.action_ids.reshape(batch_size * slots, action_width)
        action_mask = batch.action_mask.reshape(batch_size * slots, action_width)
        steps = torch.arange(action_width, device=actions.device)
        action_pass = dict(
            input_ids=actions,
            position_ids=batch.prompt_mask.sum(1).repeat_interleave(slots)[:, None] + steps[None, :],
            output_hidden_states=hidden,
            logits_to_keep=steps[:-1],
        )
        if self.shared_prompt:  # actions attend to their prompt's keys/values where they are (shared_prompt.py)
            shared = SharedPrompt(
                [layer.keys for layer in cache.layers],
                [layer.values for layer in cache.layers],
                batch.prompt_mask.bool(),
                action_mask.bool(),
                slots,
            )
            with shared_prompt_attention(model):
                out = model(**action_pass, attention_mask=action_mask, use_cache=False, shared_prompt=shared)
        else:
            owner = torch.arange(batch_size, device=actions.device).repeat_interleave(slots)
            cache.batch_select_indices(owner)  # one copy of each prompt's keys/values per action
            mask = torch.cat([batch.prompt_mask[owner], action_mask], 1)
            mask = self._mask(mask, queries=action_width, causal=True, past=prompt_width)
            out = model(**action_pass, attention_mask=mask, past_key_values=cache)
        logits = torch.cat([prefix.logits.repeat_interleave(slots, 0), out.logits], 1)
        logp = _token_logp(logits, actions, action_mask).reshape(batch_size, slots)
        if not hidden:
            return LMOutput(logp)
        states = out.hidden_states[-1]
        last = states[torch.arange(len(states), device=states.device), action_mask.sum(1) - 1]
        return LMOutput(logp, last.reshape(batch_size, slots, -1), prefix.hidden_states[-1][:, -1])

    def concat_hidden(self, batch: CandidateBatch) -> torch.Tensor:
        """[B, C, d] the paper's critic input: the LLM reads prompt + action, one sequence per action.

        For a seq2seq model the encoder reads the sequence and the decoder's state at the start token summarises
        it; for a causal LM, the last token's state does. The stacks alone run: no LM head.
        """
        model = self._module(self._active)
        if batch.concat_ids is None:
            raise ValueError("this batch has no prompt + action rows: build it with concat=True")
        batch_size, slots, width = batch.concat_ids.shape
        ids = batch.concat_ids.reshape(batch_size * slots, width)
        mask = batch.concat_mask.reshape(batch_size * slots, width)
        if self.seq2seq:
            padding = self._mask(mask)
            encoded = model.get_encoder()(input_ids=ids, attention_mask=padding).last_hidden_state
            states = model.get_decoder()(
                input_ids=torch.full_like(ids[:, :1], model.config.decoder_start_token_id),
                encoder_hidden_states=encoded,
                encoder_attention_mask=padding,
                use_cache=False,
            ).last_hidden_state
        else:
            states = model.get_decoder()(
                input_ids=ids,
                attention_mask=self._mask(mask, queries=width, causal=True),
                position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                use_cache=False,
            ).last_hidden_state
        return states[:, -1].reshape(batch_size, slots, -1)

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


def compile_seconds() -> float:
    """Seconds this process has spent compiling with torch.compile (`model.compile`), cache hits included."""
    headers, rows = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
    return float(dict(zip(headers, rows)).get("_compile.compile_inner", 0.0))


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
