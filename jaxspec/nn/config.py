"""Model configuration read from (and written to) a Hugging Face `config.json`.

The config is frozen and hashable: it is static data for `jit`, while everything that
differs per request (sampling params, keys, lengths) travels as arrays.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "gemma3_text")
FULL, SLIDING = "full_attention", "sliding_attention"  # HF `layer_types`
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
    """A decoder of the Llama family: Llama 1–3, Mistral (no sliding window), Qwen2 (q/k/v
    bias), and Gemma 3's text decoder (`model_type` "gemma3_text"), which is the same block with
    five switches on: GeGLU, RMS norms on queries and keys, norms after attention and the MLP
    as well as before, embeddings scaled by sqrt(hidden), and local layers that attend over a
    sliding window with their own RoPE base.

    Norm weights are held as the multiplier itself: Gemma's checkpoints store `w` for a
    multiplier `1 + w` (`jaxspec.ckpts.checkpoint` adds and removes the 1)."""

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
    hidden_act: str = "silu"  # "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma)
    qk_norm: bool = False  # RMS norm over each query and key head before RoPE (Gemma 3)
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma 2/3)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    query_pre_attn_scalar: int | None = None  # scores / sqrt(this); None: head_dim
    sliding_window: int | None = None  # a local layer's query at p sees p-W+1..p
    layer_types: tuple[str, ...] = ()  # per layer FULL or SLIDING; () means all FULL
    rope_local_theta: float = 10000.0  # RoPE base of the SLIDING layers (no scaling)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act not in HIDDEN_ACTS:
            raise CheckpointError(
                f"unsupported hidden_act {self.hidden_act!r}; jaxspec supports {HIDDEN_ACTS}"
            )
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise CheckpointError(
                f"layer_types has {len(self.layer_types)} entries for "
                f"{self.num_hidden_layers} layers"
            )
        if set(self.layer_types) - {FULL, SLIDING}:
            raise CheckpointError(f"layer_types must be {FULL!r} or {SLIDING!r}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise CheckpointError("sliding_attention layers need a sliding_window")

    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer`, None for a layer that sees every position."""
        if self.layer_types and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    @property
    def is_gemma(self) -> bool:
        return self.model_type == GEMMA3_BLOCK["model_type"]

    @property
    def prompt_starts_with_bos(self) -> bool:
        """Whether a prompt must begin with the BOS token: Gemma's (its tokenizers add it, HF's
        `add_bos_token` and the GGUF's; without it its text degenerates at once)."""
        return self.is_gemma and self.bos_token_id is not None

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        nq, nkv = self.num_attention_heads, self.num_key_value_heads
        attn = h * d * (nq + 2 * nkv) + nq * d * h
        attn += (nq + 2 * nkv) * d * self.qkv_bias + h * self.o_bias + 2 * d * self.qk_norm
        mlp = 3 * h * i + (2 * i + h) * self.mlp_bias
        per_layer = attn + mlp + (4 if self.sandwich_norms else 2) * h
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
        if model_type == "gemma3_text":
            return _gemma3_from_hf(cfg)
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
                eos_token_ids=_eos_ids(cfg),
            )
        except KeyError as e:
            raise CheckpointError(f"config.json lacks required field {e.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        """The HF `config.json` dict (transformers 5.x layout) for this config."""
        if self.is_gemma:
            return _gemma3_to_hf(self)
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


HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")


def _eos_ids(cfg: dict[str, Any]) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return tuple(int(e) for e in eos_ids)


# What makes a Llama block Gemma 3's, whichever file it was read from (HF, GGUF, a test's).
GEMMA3_BLOCK: dict[str, Any] = dict(
    model_type="gemma3_text", qk_norm=True, sandwich_norms=True, embed_scale=True
)


def gemma3_layer_types(n_layers: int, pattern: int = 6) -> tuple[str, ...]:
    """Gemma 3's layout: every `pattern`-th layer global, the others local."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))


def _gemma3_from_hf(cfg: dict[str, Any]) -> LlamaConfig:
    """A Gemma 3 text config (transformers 4.5x and 5.x layouts)."""
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(cap) is not None:
            raise CheckpointError(f"Gemma {cap} is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    params = cfg.get("rope_parameters") or {}
    if FULL in params:  # 5.x: one rope dict per layer type
        full = dict(params[FULL])
        local_theta = float(params.get(SLIDING, {}).get("rope_theta", 10000.0))
    else:
        full = dict(params) or {"rope_theta": cfg.get("rope_theta", 1_000_000.0)}
        if cfg.get("rope_scaling"):
            full |= cfg["rope_scaling"]
        local_theta = float(cfg.get("rope_local_base_freq", 10000.0))
    theta, scaling = _rope_from_hf({"rope_parameters": full})
    try:
        n_heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        n_layers = int(cfg["num_hidden_layers"])
        types = tuple(cfg.get("layer_types") or ()) or gemma3_layer_types(
            n_layers, int(cfg.get("sliding_window_pattern", 6))
        )
        return LlamaConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or 256),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            qkv_bias=bool(cfg.get("attention_bias", False)),
            o_bias=bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg),
            hidden_act=act,
            query_pre_attn_scalar=int(cfg.get("query_pre_attn_scalar") or 256),
            sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") else None,
            layer_types=types,
            rope_local_theta=local_theta,
            **GEMMA3_BLOCK,
        )
    except KeyError as e:
        raise CheckpointError(f"config.json lacks required field {e.args[0]!r}") from None


def _gemma3_to_hf(c: LlamaConfig) -> dict[str, Any]:
    full: dict[str, Any] = {"rope_type": c.rope_scaling.rope_type, "rope_theta": c.rope_theta}
    if c.rope_scaling.rope_type != "default":
        full["factor"] = c.rope_scaling.factor
    eos: Any = list(c.eos_token_ids) if len(c.eos_token_ids) != 1 else c.eos_token_ids[0]
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_activation": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {
            FULL: full,
            SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_theta},
        },
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.qkv_bias,
        "query_pre_attn_scalar": c.query_pre_attn_scalar or c.head_dim,
        "sliding_window": c.sliding_window,
        "layer_types": list(c.layer_types or [FULL] * c.num_hidden_layers),
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos if c.eos_token_ids else None,
    }


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


def rope_inv_freq(config: LlamaConfig, local: bool = False) -> list[float]:
    """Per-pair inverse frequencies `[head_dim // 2]`, scaled as HF does for each rope type
    (`local`: a sliding-window layer's, its own base and no scaling)."""
    d = config.head_dim
    theta = config.rope_local_theta if local else config.rope_theta
    inv = [1.0 / theta ** (i / d) for i in range(0, d, 2)]
    if local:
        return inv
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
