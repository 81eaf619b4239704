"""Checkpoints: HF safetensors and GGUF files in and out, the tokenizer's text and chat
prompts, the shipped tiny models and random ones."""
