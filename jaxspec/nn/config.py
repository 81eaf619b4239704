"""Model configuration read from (and written to) a Hugging Face `config.json`.

The config is frozen and hashable: it is static data for `jit`, while everything that
differs per request (sampling params, keys, lengths) travels as arrays.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class CheckpointError(ValueError):
    """A checkpoint directory or config that jaxspec cannot load (the message says why)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling; `rope_type` "default" means none."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """A Llama-family decoder: Llama 1–3, Mistral (no sliding window), Qwen2 (q/k/v bias)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 / Llama `attention_bias`
    o_bias: bool = False  # Llama `attention_bias` also biases o_proj
    mlp_bias: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        nq, nkv = self.num_attention_heads, self.num_key_value_heads
        attn = h * d * (nq + 2 * nkv) + nq * d * h
        attn += (nq + 2 * nkv) * d * self.qkv_bias + h * self.o_bias
        mlp = 3 * h * i + (2 * i + h) * self.mlp_bias
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * per_layer + emb + h

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        """Build from a parsed HF `config.json` (transformers 4.x and 5.x layouts)."""
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"unsupported model_type {model_type!r}; jaxspec supports {SUPPORTED_MODEL_TYPES}"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU)")
        if model_type == "mistral" and cfg.get("sliding_window") is not None:
            raise CheckpointError("Mistral sliding-window attention is not supported")
        if model_type == "qwen2" and cfg.get("use_sliding_window"):
            raise CheckpointError("Qwen2 sliding-window attention is not supported")
        try:
            n_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            head_dim = cfg.get("head_dim") or hidden // n_heads
            rope_theta, scaling = _rope_from_hf(cfg)
            if model_type == "qwen2":
                qkv_bias, o_bias = True, False
            else:
                qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=scaling,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=qkv_bias,
                o_bias=o_bias,
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                model_type=model_type,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
            )
        except KeyError as e:
            raise CheckpointError(f"config.json lacks required field {e.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        """The HF `config.json` dict (transformers 5.x layout) for this config."""
        rope: dict[str, Any] = {"rope_type": self.rope_scaling.rope_type}
        rope["rope_theta"] = self.rope_theta
        if self.rope_scaling.rope_type != "default":
            rope["factor"] = self.rope_scaling.factor
        if self.rope_scaling.rope_type == "llama3":
            s = self.rope_scaling
            rope |= {
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
        eos: Any = (
            list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0]
        )
        out: dict[str, Any] = {
            "architectures": [
                "Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"
            ],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "mlp_bias": self.mlp_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos if self.eos_token_ids else None,
        }
        if self.model_type != "qwen2":
            out["attention_bias"] = self.qkv_bias
        if self.rope_scaling.rope_type != "default":
            out["rope_scaling"] = rope
        return out


def _rope_from_hf(cfg: dict[str, Any]) -> tuple[float, RopeScaling]:
    """RoPE base and scaling from `rope_parameters` (5.x) or `rope_theta`/`rope_scaling` (4.x)."""
    params = cfg.get("rope_parameters") or {}
    legacy = cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    src = params if params.get("rope_type", "default") != "default" else legacy or params
    rope_type = src.get("rope_type", src.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"unsupported rope scaling {rope_type!r}; jaxspec supports {SUPPORTED_ROPE_TYPES}"
        )
    if rope_type == "default":
        return theta, RopeScaling()
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(src.get("factor", 1.0)),
        low_freq_factor=float(src.get("low_freq_factor", 1.0)),
        high_freq_factor=float(src.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(src.get("original_max_position_embeddings", 8192)),
    )


def rope_inv_freq(config: LlamaConfig) -> list[float]:
    """Per-pair inverse frequencies `[head_dim // 2]`, scaled as HF does for each rope type."""
    d = config.head_dim
    inv = [1.0 / config.rope_theta ** (i / d) for i in range(0, d, 2)]
    s = config.rope_scaling
    if s.rope_type == "linear":
        return [f / s.factor for f in inv]
    if s.rope_type == "llama3":
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        out = []
        for f in inv:
            wavelen = 2 * math.pi / f
            if wavelen > low_wavelen:
                out.append(f / s.factor)
            elif wavelen < high_wavelen:
                out.append(f)
            else:
                smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                    s.high_freq_factor - s.low_freq_factor
                )
                out.append((1 - smooth) * f / s.factor + smooth * f)
        return out
    return inv
