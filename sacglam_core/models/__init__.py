"""Hugging Face LLMs: loading (hub id or local folder, LoRA, 4-bit; models/loading.py) and the tiny
models built offline (models/tiny.py). Their settings live in sacglam_core/config.py."""
