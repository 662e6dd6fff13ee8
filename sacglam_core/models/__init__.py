"""Hugging Face LLMs: loading (hub id or local folder, LoRA, 4-bit; models/loading.py), the Hub's cache and staging
(models/hub.py), and the tokenizer and Flan-T5-shaped models the benchmarks build. Their settings live in
sacglam_core/config.py; the project's own tiny models in sacglam_core/tiny."""
