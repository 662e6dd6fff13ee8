"""Tiny models built offline for tests and the local profile: a T5 and a Llama-style causal LM, and the same
causal LM pre-trained on language.

The first two share a word-level tokenizer trained on the environment's vocabulary. A randomly initialised LM
scores short actions far above long ones (each token costs about log(vocab)), which a pre-trained LLM
does not. So their build ends with a short, task-agnostic "pre-training" that fits the GLAM policy to the
uniform distribution over the candidates of prompts from random play. They then start near the uniform
(random) policy and tell the scene's objects apart, but know nothing of the goals: GLAM's non-pretrained agent.

`tiny-causal-pretrained` learns language instead, by next-token prediction on the corpus of `corpus.py`
(taxonomy, colours, affordances in prose, definitions, scenes and selection tasks of other domains, no
solution of the task), meant to give a prior like a pre-trained LLM's: `python -m sacglam_core.pipeline.prior`
measures it (docs/prior.md).

Everything is seeded and runs on one thread, so a build is reproducible on one kind of CPU; another CPU's float
kernels (MKL's above all) round differently and train other weights. So the project ships the two causal LMs'
weights (`weights/`, with their SHA-256), and a build writes those unless asked to train (`train=True`): every
machine then runs the demo from the same bytes.
"""

from __future__ import annotations

import hashlib
import math
import random
import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, T5Config, T5ForConditionalGeneration

from sacglam_core.envs import EnvConfig, VectorPlayground
from sacglam_core.models.tokenizer import build_tokenizer
from sacglam_core.settings import settings
from sacglam_core.tiny.corpus import corpus

TINY_T5 = "tiny-t5"
TINY_CAUSAL = "tiny-causal"
TINY_PRETRAINED = "tiny-causal-pretrained"
WEIGHTS = Path(__file__).with_name("weights")
# SHA-256 of the shipped model.safetensors files, as `--train` builds made them on an Intel Xeon (AVX-512) machine
# of this project's kind, with the kernels pinned as every entry point pins them (sacglam_core/cpu.py).
SHIPPED = {
    TINY_CAUSAL: "1e56247e236a4baf1963c5b03dd99a0cf0f6bea13d962e9e06ac48e1f18309c0",
    TINY_PRETRAINED: "ccf16e4b07e1288059e661fd42a3e8c77a7c51228923a538765f673838bbbf99",
}


class ShippedWeightsError(RuntimeError):
    """A shipped weights file is missing or is not the one the project committed."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shipped_weights(name: str) -> Path:
    """The shipped weights of `name`, after checking their SHA-256."""
    path = WEIGHTS / f"{name}.safetensors"
    try:
        digest = sha256(path)
    except OSError as error:
        raise ShippedWeightsError(f"{path}: {error.strerror}: restore it with `git checkout -- {path}`") from None
    if digest != SHIPPED[name]:
        raise ShippedWeightsError(
            f"{path}: SHA-256 {digest[:16]}..., expected {SHIPPED[name][:16]}... (sacglam_core/tiny/build.py): the "
            f"file was damaged or replaced; restore it with `git checkout -- {path}`"
        )
    return path


@settings
class TinySpec:
    d_model: int = 128
    layers: int = 2
    heads: int = 4
    d_ff: int = 256
    prior_steps: int = 60
    prior_batch: int = 32
    prior_lr: float = 2e-3
    lm_epochs: int = 4  # passes over the language corpus (tiny-causal-pretrained)
    lm_batch: int = 16  # 3,500 steps in 4 passes: at 64 (875 steps) the model had not learnt to copy a name
    lm_lr: float = 1e-3
    seed: int = 0


def tiny_t5(vocab_size: int, spec: TinySpec) -> T5ForConditionalGeneration:
    config = T5Config(
        vocab_size=vocab_size,
        d_model=spec.d_model,
        d_kv=spec.d_model // spec.heads,
        num_heads=spec.heads,
        d_ff=spec.d_ff,
        num_layers=spec.layers,
        num_decoder_layers=spec.layers,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,  # Flan-T5's setting: no d_model**-0.5 scaling of the decoder output
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = T5ForConditionalGeneration(config)
    # transformers 5 ties T5's output layer to the embeddings whatever the config says; at the default
    # std of 1 the softmax saturates (and backward slows on denormals), so re-scale them.
    nn.init.normal_(model.shared.weight, std=spec.d_model**-0.5)
    return model


def tiny_causal(vocab_size: int, spec: TinySpec) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=spec.d_ff,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=3,
    )
    return LlamaForCausalLM(config)


def pretrain_prior(model: PreTrainedModel, tokenizer, spec: TinySpec) -> float:
    """Fit the GLAM policy to the uniform distribution over candidates, on prompts from random play
    in both environment variants. Returns the last KL(uniform || policy), in nats."""
    from sacglam_core.agent.lm import GlamLM
    from sacglam_core.agent.policy import CandidateDistribution
    from sacglam_core.agent.tokens import PromptTokens

    lm = GlamLM(model, tokenizer, "seq2seq" if model.config.is_encoder_decoder else "causal")
    tokens = PromptTokens(tokenizer)
    rng = random.Random(spec.seed)
    variants = [
        VectorPlayground(spec.prior_batch, c, seed=spec.seed + i)
        for i, c in enumerate((EnvConfig(), EnvConfig.simplified_variant()))
    ]
    states = [envs.reset() for envs in variants]
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.prior_lr)
    model.train()
    kl = float("nan")
    for step in range(spec.prior_steps):
        envs, (obs, infos) = variants[step % 2], states[step % 2]
        batch = lm.batch(
            [tokens.prompt(g, o) for g, o in zip(infos["goal"], obs)],
            [tokens.actions(a) for a in infos["possible_actions"]],
        )
        policy = CandidateDistribution.from_scores(lm.score(batch).action_logp, batch)
        counts = policy.mask.sum(1)
        loss = -(policy.log_probs.sum(1) / counts).mean()  # cross-entropy of the uniform target
        kl = float(loss.detach() - counts.float().log().mean())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        obs, _, _, _, infos = envs.step([rng.choice(a) for a in infos["possible_actions"]])
        states[step % 2] = (obs, infos)
    model.eval()
    return kl


def pretrain_language(model: PreTrainedModel, tokenizer, lines: list[str], spec: TinySpec) -> float:
    """Next-token prediction on `lines`, `spec.lm_epochs` passes in a seeded order. Returns the last epoch's mean
    loss per token, in nats."""
    rng = random.Random(spec.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lm_lr)
    # Linear decay to zero: the model ends where the loss has settled, not wherever the last full-rate step left it.
    steps = spec.lm_epochs * math.ceil(len(lines) / spec.lm_batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    loss_per_token = float("nan")
    for epoch in range(spec.lm_epochs):
        order = list(range(len(lines)))
        rng.shuffle(order)
        total, tokens = 0.0, 0
        for start in range(0, len(order), spec.lm_batch):
            batch = tokenizer(
                [lines[i] for i in order[start : start + spec.lm_batch]], padding=True, return_tensors="pt"
            )
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            loss = model(**batch, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            count = int((labels[:, 1:] != -100).sum())
            total, tokens = total + loss.item() * count, tokens + count
        loss_per_token = total / tokens
        print(
            f"  language pre-training epoch {epoch + 1}/{spec.lm_epochs}: {loss_per_token:.3f} nats per token",
            flush=True,
        )
    model.eval()
    return loss_per_token


def build_tiny(out_dir: str | Path, spec: TinySpec | None = None, train: bool = False) -> dict[str, Path]:
    """Write `<out_dir>/tiny-t5` and `<out_dir>/tiny-causal` (model and tokenizer each): the uniform-prior models.
    `tiny-causal` gets the shipped weights unless `train` or another `spec` asks for a build of its own."""
    spec = spec or TinySpec()
    out_dir = Path(out_dir)
    shipped = {TINY_CAUSAL: shipped_weights(TINY_CAUSAL)} if not train and spec == TinySpec() else {}  # before writing
    paths = {}
    for name, builder, add_eos in ((TINY_T5, tiny_t5, True), (TINY_CAUSAL, tiny_causal, False)):
        torch.manual_seed(spec.seed)
        tokenizer = build_tokenizer(add_eos=add_eos)
        model = builder(len(tokenizer), spec)
        if name in shipped:
            paths[name] = _save(model, tokenizer, out_dir / name, weights=shipped[name])
            continue
        kl = pretrain_prior(model, tokenizer, spec)
        paths[name] = _save(model, tokenizer, out_dir / name, f"KL(uniform || policy) {kl:.4f} nats")
    return paths


def build_pretrained(out_dir: str | Path, spec: TinySpec | None = None, train: bool = False) -> Path:
    """Write `<out_dir>/tiny-causal-pretrained`: the causal LM after next-token prediction on the corpus; the
    shipped weights unless `train` or another `spec` asks for a build of its own (about 5 minutes on one thread)."""
    spec = spec or TinySpec()
    torch.manual_seed(spec.seed)
    lines = corpus(spec.seed)
    tokenizer = build_tokenizer(add_eos=False, extra=lines)
    model = tiny_causal(len(tokenizer), spec)
    if not train and spec == TinySpec():
        return _save(model, tokenizer, Path(out_dir) / TINY_PRETRAINED, weights=shipped_weights(TINY_PRETRAINED))
    loss = pretrain_language(model, tokenizer, lines, spec)
    what = f"{len(lines):,} corpus lines, {loss:.3f} nats per token"
    return _save(model, tokenizer, Path(out_dir) / TINY_PRETRAINED, what)


def _save(model: PreTrainedModel, tokenizer, path: Path, what: str = "", weights: Path | None = None) -> Path:
    """The model's folder, swapped into place whole; with `weights`, those bytes as its model.safetensors."""
    tmp = path.with_name(f".{path.name}.tmp")
    model.save_pretrained(tmp)
    tokenizer.backend_tokenizer.no_padding()  # training's batches left padding on: the file must not depend on it
    tokenizer.save_pretrained(tmp)
    if weights is not None:
        shutil.copyfile(weights, tmp / "model.safetensors")
        what = f"the shipped weights {weights}"
    digest = sha256(tmp / "model.safetensors")
    if weights is not None and digest != SHIPPED[path.name]:
        shutil.rmtree(tmp)
        raise ShippedWeightsError(f"{tmp / 'model.safetensors'}: the copy of {weights} has SHA-256 {digest[:16]}...")
    _replace_dir(tmp, path)
    print(
        f"built {path}: {sum(p.numel() for p in model.parameters()):,} parameters, {what}, SHA-256 {digest}", flush=True
    )
    return path


def _replace_dir(tmp: Path, final: Path) -> None:
    """Swap a finished folder into place (rename is atomic; the old one is removed after)."""
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
