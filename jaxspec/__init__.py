"""jaxspec: multi-tenant edge-cloud speculative decoding in JAX (core, pure functions).

The names below load on first use (`jaxspec.lazy`, PEP 562), so importing one light submodule
(the protocol's figures, the wire's types) does not load JAX and the model with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxspec.lazy import lazy_names
from jaxspec.quiet import drop_no_torch_notice

drop_no_torch_notice()  # before any of jaxspec's modules imports transformers

# public name -> the submodule that defines it
_EXPORTS = {
    "load": "ckpts.checkpoint", "load_gguf": "ckpts.checkpoint", "save": "ckpts.checkpoint",
    "generation_defaults": "ckpts.checkpoint",
    "CheckpointError": "nn.config", "LlamaConfig": "nn.config", "RopeScaling": "nn.config",
    "AcceptanceFigures": "figures",
    "GenerateOutput": "decoding.generate", "GenerateStats": "decoding.generate",
    "generate": "decoding.generate",
    "KVCache": "nn.model", "Llama": "nn.model", "Model": "nn.model", "forward": "nn.model",
    "init_cache": "nn.model", "init_params": "nn.model",
    "DraftSpec": "protocol", "SamplingSettings": "protocol",
    "quantize": "quant.quantize",
    "Purpose": "decoding.sampling", "SamplingParams": "decoding.sampling",
    "position_key": "decoding.sampling",
    "session_key": "decoding.sampling", "warp": "decoding.sampling",
    "chat_prompt": "nn.text", "decode_text": "nn.text", "encode_prompt": "nn.text",
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


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from jaxspec.ckpts.checkpoint import generation_defaults, load, load_gguf, save
    from jaxspec.decoding.generate import GenerateOutput, GenerateStats, generate
    from jaxspec.decoding.sampling import Purpose, SamplingParams, position_key, session_key, warp
    from jaxspec.figures import AcceptanceFigures
    from jaxspec.nn.config import CheckpointError, LlamaConfig, RopeScaling
    from jaxspec.nn.model import KVCache, Llama, Model, forward, init_cache, init_params
    from jaxspec.nn.text import chat_prompt, decode_text, encode_prompt
    from jaxspec.protocol import DraftSpec, SamplingSettings
    from jaxspec.quant.quantize import quantize
