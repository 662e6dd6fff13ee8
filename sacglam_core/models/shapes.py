"""Models of a published model's shape with random weights: timing, FLOP counting and GPU checks at the
paper's scale need no Hub. Random weights are fine for cost; they say nothing of learning."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import T5Config, T5ForConditionalGeneration

from sacglam_core.models.tokenizer import build_tokenizer

# google/flan-t5-base's config.json (the paper's model, "Flan-T5 250M").
FLAN_T5_BASE = {
    "vocab_size": 32128, "d_model": 768, "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_decoder_layers": 12,
    "num_heads": 12, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "dropout_rate": 0.0,
    "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
}  # fmt: skip


def flan_t5_base_shaped(dtype: torch.dtype = torch.float32) -> T5ForConditionalGeneration:
    """Random weights of Flan-T5-base's shape (248M parameters) on the default device; under
    `torch.device("meta")` it costs nothing, for counting."""
    model = T5ForConditionalGeneration._from_config(T5Config(**FLAN_T5_BASE), dtype=dtype)
    if model.shared.weight.device.type != "meta":
        # transformers 5 ties T5's output layer to the embeddings: at std 1 the softmax saturates (stack notes).
        torch.nn.init.normal_(model.shared.weight, std=FLAN_T5_BASE["d_model"] ** -0.5)
    return model


def save_flan_t5_base_shaped(out_dir: str | Path, seed: int = 0) -> Path:
    """A model folder (random Flan-T5-base-shaped weights, the project's word-level tokenizer) that
    `model.name_or_path` can point at. Flan-T5's own tokenizer needs the Hub; the word-level one gives
    each environment word one token, a little fewer than Flan-T5's SentencePiece would."""
    torch.manual_seed(seed)
    path = Path(out_dir)
    flan_t5_base_shaped().save_pretrained(path)
    build_tokenizer(add_eos=True).save_pretrained(path)
    return path
