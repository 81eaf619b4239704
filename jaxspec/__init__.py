"""jaxspec: multi-tenant edge-cloud speculative decoding in JAX (core, pure functions)."""

from jaxspec.checkpoint import generation_defaults, load, load_gguf, save
from jaxspec.config import CheckpointError, LlamaConfig, RopeScaling
from jaxspec.generate import GenerateOutput, GenerateStats, generate
from jaxspec.model import KVCache, Llama, Model, forward, init_cache, init_params
from jaxspec.protocol import DraftSpec
from jaxspec.quantize import quantize
from jaxspec.sampling import Purpose, SamplingParams, position_key, session_key, warp
from jaxspec.text import chat_prompt, decode_text, encode_prompt

__all__ = [
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
]
