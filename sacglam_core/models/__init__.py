"""Loading Hugging Face LLMs (hub id or local folder, LoRA, 4-bit) and building the tiny offline models."""

from sacglam_core.models.loading import LoraSettings, ModelConfig, ModelNotFoundError, load_model, load_tokenizer

__all__ = ["LoraSettings", "ModelConfig", "ModelNotFoundError", "load_model", "load_tokenizer"]
