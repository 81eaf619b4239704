"""GGUF files (llama.cpp's format) -> `Model`.

The file is read with the `gguf` package (llama.cpp's own reader) and every tensor is
dequantized to float32 by its `gguf.quants`; this module only maps names and metadata:

    llama.cpp tensor            HF tensor (then `checkpoint.params_from_hf`)
    token_embd.weight           model.embed_tokens.weight
    output.weight               lm_head.weight           (absent: tied embeddings)
    output_norm.weight          model.norm.weight
    blk.N.attn_q.weight         model.layers.N.self_attn.q_proj.weight  (RoPE rows un-permuted)
    blk.N.attn_k.weight         model.layers.N.self_attn.k_proj.weight  (RoPE rows un-permuted)
    blk.N.attn_{v,output}       ...self_attn.{v,o}_proj.weight
    blk.N.ffn_{gate,up,down}    ...mlp.{gate,up,down}_proj.weight
    blk.N.{attn,ffn}_norm       ...{input,post_attention}_layernorm.weight

llama.cpp's converter permutes the rows of Q and K so that its RoPE rotates adjacent pairs
(x0, x1) where HF rotates halves (x_i, x_{i+d/2}); `_unpermute` is the inverse. A `gemma3`
file is read too: its Q and K are not permuted (llama.cpp rotates Gemma's halves), it adds
`attn_{q,k}_norm`, `post_attention_norm` and `post_ffw_norm`, its `ffn_norm` is HF's
`pre_feedforward_layernorm`, and its norm weights hold 1 + w where HF's hold w (so 1 is
taken off here, as transformers does). The config comes from the `llama.*` (`gemma3.*`)
metadata, the tokenizer (with its chat template) from the
`tokenizer.*` metadata through transformers' GGUF tokenizer builder (no torch needed).
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import numpy as np

from jaxspec.nn.config import GEMMA3_BLOCK, CheckpointError, LlamaConfig, gemma3_layer_types

PathLike = str | os.PathLike[str]

# Tensor types this importer takes (all dequantized by gguf.quants). The first eight are
# covered by tests that write a file of each type and compare with transformers; the K-quants
# go through the same gguf code that transformers uses for them.
SUPPORTED_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_LAYER_NAMES = _LAYER_NAMES | {
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
ARCHITECTURES = ("llama", "gemma3")
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def find_gguf(path: PathLike) -> pathlib.Path | None:
    """The GGUF file `path` names: the file itself, or the only `*.gguf` in a directory that
    has no `config.json` (an HF checkpoint takes precedence). None when it names no GGUF."""
    p = pathlib.Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(p.glob("*.gguf"))
        if len(found) > 1:
            raise CheckpointError(
                f"{p} holds {len(found)} GGUF files ({', '.join(f.name for f in found)}); "
                "name one of them"
            )
        return found[0] if found else None
    return None


def gguf_reader(path: pathlib.Path) -> Any:
    """A `gguf.GGUFReader` over the file at `path` (memory-mapped, nothing loaded yet), or a
    `CheckpointError` naming the file when the reader cannot parse it (the reader raises
    ValueError, struct.error, IndexError... : callers catch one error that says which file)."""
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, IndexError...
        raise CheckpointError(f"{path} is not a readable GGUF file: {e}") from e


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    """The value of the metadata key `key` (e.g. "llama.context_length") in a `gguf_reader`'s
    file, `default` when the file does not have it."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader: Any, where: str = "") -> LlamaConfig:
    """The `LlamaConfig` of a GGUF file's `llama.*` (or `gemma3.*`) metadata."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{where}: GGUF architecture {arch!r} is not supported; jaxspec reads "
            f"{', '.join(map(repr, ARCHITECTURES))}"
        )
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise CheckpointError(f"{where}: per-frequency RoPE factors (rope_freqs) not supported")
    scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise CheckpointError(f"{where}: RoPE scaling {scaling!r} in a GGUF is not supported")

    def need(key: str) -> Any:
        v = gguf_field(reader, f"{arch}.{key}")
        if v is None:
            raise CheckpointError(f"{where}: GGUF metadata lacks {arch}.{key}")
        return v

    def opt(key: str, default: Any) -> Any:
        return gguf_field(reader, f"{arch}.{key}", default)

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = opt("vocab_size", None) or (len(tokens.data) if tokens else None)
    if vocab is None:
        raise CheckpointError(f"{where}: GGUF metadata gives no vocabulary size")
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    n_layers = int(need("block_count"))
    head_dim = int(opt("attention.key_length", hidden // heads))
    gemma: dict[str, Any] = {}
    if arch == "gemma3":  # llama.cpp's fixed Gemma 3 choices: 5 local layers to 1 global,
        gemma = dict(  # the local RoPE base 10000, scores over sqrt(head_dim)
            GEMMA3_BLOCK,
            hidden_act="gelu_pytorch_tanh",
            query_pre_attn_scalar=head_dim,
            sliding_window=int(need("attention.sliding_window")),
            layer_types=gemma3_layer_types(n_layers),
            rope_local_theta=10000.0,
        )
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(opt("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(opt("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(opt("rope.freq_base", 10000.0)),
        max_position_embeddings=int(opt("context_length", 2048)),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        **({"model_type": "llama"} | gemma),
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of Q/K rows `[n_head * d, in]` (pairs -> halves)."""
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _dequantize(t: Any, where: str) -> np.ndarray:
    from gguf import quants

    kind = t.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise CheckpointError(
            f"{where}: tensor {t.name!r} has GGUF type {kind}, which jaxspec does not read "
            f"(supported: {', '.join(SUPPORTED_TYPES)})"
        )
    shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
    return np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)


def gguf_tensors(
    reader: Any, config: LlamaConfig, where: str = "", progress: Any = None
) -> dict[str, np.ndarray]:
    """Every tensor of the file, dequantized to float32, under its HF name and layout.
    `progress("convert", done, total)` is called after each tensor when given."""
    out: dict[str, np.ndarray] = {}
    layer_names = _GEMMA3_LAYER_NAMES if config.is_gemma else _LAYER_NAMES
    for i, t in enumerate(reader.tensors):
        m = _BLOCK.match(t.name)
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        elif m and m.group(2) in layer_names:
            name = f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.weight"
        else:
            raise CheckpointError(
                f"{where}: GGUF tensor {t.name!r} has no place in a {config.model_type} model"
            )
        w = _dequantize(t, where)
        if config.is_gemma:
            w = w - 1.0 if name.endswith("norm.weight") else w
        elif m and m.group(2) == "attn_q":
            w = _unpermute(w, config.num_attention_heads)
        elif m and m.group(2) == "attn_k":
            w = _unpermute(w, config.num_key_value_heads)
        out[name] = w
        if progress:
            progress("convert", i + 1, len(reader.tensors))
    return out


def gguf_tokenizer(path: pathlib.Path, reader: Any = None) -> Any:
    """The file's tokenizer (vocabulary, merges, special tokens, chat template) as a
    transformers fast tokenizer.

    transformers' own `from_pretrained(..., gguf_file=)` reads the metadata with a reader that
    imports torch; here the metadata comes from the `gguf` package and only transformers'
    builder (`convert_gguf_tokenizer`, torch-free) runs, with the same inputs its
    `get_gguf_tokenizer` would give it, so jaxspec needs no torch (a test holds the two
    tokenizers equal)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    reader = reader if reader is not None else gguf_reader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    grouped = {
        group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items()
                if f"tokenizer.{key}" in meta}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }  # fmt: skip
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":  # as transformers does for sentencepiece
        config.setdefault("add_bos_token", True)
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    try:
        backend, extra = convert_gguf_tokenizer(
            gguf_field(reader, "general.architecture"), tokenizer
        )
        return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
    except Exception as e:  # transformers raises many types here
        raise CheckpointError(f"{path}: the GGUF tokenizer could not be built: {e}") from e


def has_tokenizer(reader: Any) -> bool:
    return "tokenizer.ggml.tokens" in reader.fields


def read_gguf(
    path: pathlib.Path, progress: Any = None
) -> tuple[LlamaConfig, dict[str, np.ndarray], Any]:
    """`(config, HF-named float32 tensors, reader)` of a GGUF file."""
    reader = gguf_reader(path)
    config = gguf_config(reader, str(path))
    return config, gguf_tensors(reader, config, str(path), progress), reader
