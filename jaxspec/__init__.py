"""jaxspec: multi-tenant edge-cloud speculative decoding in JAX (core, pure functions).

The names below load on first use (PEP 562), so importing one light submodule (the protocol's
figures, the wire's types) does not load JAX and the model with it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from typing import TYPE_CHECKING, Any


class _NoTorchNotice(logging.Filter):
    """Drops the one notice `import transformers` prints without torch ("PyTorch was not
    found. Models won't be available…"): jaxspec uses transformers for tokenizers only, which
    need no torch, so every command printed a warning about nothing. Every other message of
    transformers' logger passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


# Installed when jaxspec is imported, before any of its modules imports transformers.
logging.getLogger("transformers").addFilter(_NoTorchNotice())


# public name -> the submodule that defines it
_EXPORTS = {
    "load": "checkpoint", "load_gguf": "checkpoint", "save": "checkpoint",
    "generation_defaults": "checkpoint",
    "CheckpointError": "config", "LlamaConfig": "config", "RopeScaling": "config",
    "AcceptanceFigures": "figures",
    "GenerateOutput": "generate", "GenerateStats": "generate", "generate": "generate",
    "KVCache": "model", "Llama": "model", "Model": "model", "forward": "model",
    "init_cache": "model", "init_params": "model",
    "DraftSpec": "protocol", "SamplingSettings": "protocol",
    "quantize": "quantize",
    "Purpose": "sampling", "SamplingParams": "sampling", "position_key": "sampling",
    "session_key": "sampling", "warp": "sampling",
    "chat_prompt": "text", "decode_text": "text", "encode_prompt": "text",
}  # fmt: skip

__all__ = [
    "AcceptanceFigures",
    "CheckpointError",
    "DraftSpec",
    "GenerateOutput",
    "GenerateStats",
    "KVCache",
    "Llama",
    "LlamaConfig",
    "Model",
    "Purpose",
    "RopeScaling",
    "SamplingParams",
    "SamplingSettings",
    "chat_prompt",
    "decode_text",
    "encode_prompt",
    "forward",
    "generate",
    "generation_defaults",
    "init_cache",
    "init_params",
    "load",
    "load_gguf",
    "position_key",
    "quantize",
    "save",
    "session_key",
    "warp",
]  # the keys of _EXPORTS


def __getattr__(name: str) -> Any:
    """Load the submodule that defines `name` on first use (a submodule's own name loads it)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"jaxspec.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"jaxspec.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"jaxspec.{name}":
            raise
        raise AttributeError(f"module 'jaxspec' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """`jaxspec.generate` and `jaxspec.quantize` stay the functions: the import system binds a
    submodule to its package's attribute when it loads it, which would shadow a function of
    the same name once anything imported the submodule itself."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:
    from jaxspec.checkpoint import generation_defaults, load, load_gguf, save
    from jaxspec.config import CheckpointError, LlamaConfig, RopeScaling
    from jaxspec.figures import AcceptanceFigures
    from jaxspec.generate import GenerateOutput, GenerateStats, generate
    from jaxspec.model import KVCache, Llama, Model, forward, init_cache, init_params
    from jaxspec.protocol import DraftSpec, SamplingSettings
    from jaxspec.quantize import quantize
    from jaxspec.sampling import Purpose, SamplingParams, position_key, session_key, warp
    from jaxspec.text import chat_prompt, decode_text, encode_prompt
