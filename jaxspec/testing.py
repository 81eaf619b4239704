"""Tiny fixtures that ship with the code: configs, a byte-level tokenizer, random checkpoints.

Nothing can be downloaded from a model hub here, so tests, the CLI's `init-random` and
tools build their checkpoints themselves. `write_hf_checkpoint` goes through transformers
and torch (the test oracle); `write_random_checkpoint` needs only jaxspec.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax.numpy as jnp

from jaxspec.config import LlamaConfig, RopeScaling
from jaxspec.model import Model, init_params

BOS, EOS = "<s>", "</s>"


def tiny_config(**overrides: Any) -> LlamaConfig:
    """A 2-layer GQA config small enough to compile in about a second."""
    base = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def byte_tokenizer() -> Any:
    """A byte-level tokenizer (256 byte tokens + BOS/EOS) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[BOS], vocab[EOS] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)


def write_random_checkpoint(
    path: str | os.PathLike[str], config: LlamaConfig | None = None, seed: int = 0
) -> pathlib.Path:
    """A random-weight checkpoint with the byte tokenizer, written by jaxspec alone."""
    from jaxspec.checkpoint import save

    tok = byte_tokenizer()
    if config is None:
        config = tiny_config(
            vocab_size=len(tok),
            bos_token_id=tok.bos_token_id,
            eos_token_ids=(tok.eos_token_id,),
        )
    model = Model(config=config, params=init_params(config, seed), tokenizer=tok)
    return save(model, path)


def write_hf_checkpoint(
    path: str | os.PathLike[str],
    config: LlamaConfig,
    seed: int = 0,
    std: float = 0.3,
    max_shard_size: str | None = None,
) -> Any:
    """Create a random transformers model for `config` (torch, float32), `save_pretrained`
    it to `path` and return it (eval mode) as the oracle. A large `std` keeps logits spread,
    so greedy decisions are far from ties."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = config.to_hf()
    hf_cfg.update(pad_token_id=None, dtype="float32")
    cfg = AutoConfig.for_model(**hf_cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(path), **kwargs)
    return model


def config_variants() -> dict[str, LlamaConfig]:
    """Architectures the parity tests cover: MHA/GQA/MQA, tied, rope scaling, Qwen2 biases."""
    t = tiny_config
    return {
        "gqa": t(),
        "mha": t(num_key_value_heads=4),
        "mqa_tied": t(num_key_value_heads=1, tie_word_embeddings=True),
        "llama3_rope": t(
            rope_theta=500000.0,
            rope_scaling=RopeScaling(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
        "linear_rope_attn_bias": t(
            rope_scaling=RopeScaling(rope_type="linear", factor=2.0),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
        ),
        "qwen2": dataclasses.replace(t(), model_type="qwen2", qkv_bias=True),
        "wide_head": t(head_dim=16, num_attention_heads=2, num_key_value_heads=1),
    }


def to_dtype(model: Model, dtype: Any) -> Model:
    """The same model with params and activations in `dtype` (e.g. float64 in exact tests)."""
    import jax

    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), model.params)
    return model.with_params(params, dtype=dtype)


def permute_for_gguf(w: Any, n_head: int) -> Any:
    """llama.cpp's converter `permute` of Q/K rows `[n_head * d, in]` (halves -> pairs): what
    a GGUF stores, and what `jaxspec.gguf_import` must undo."""
    import numpy as np

    w = np.asarray(w)
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(path: str | os.PathLike[str], model: Model, qtype: str = "F32") -> pathlib.Path:
    """Write `model` as a llama.cpp GGUF file the way llama.cpp's converter does (names, Q/K
    row permutation, metadata), 2-D weights stored as `qtype` (norms stay F32). No tokenizer.
    The independent check is transformers, which reads the file with its own code."""
    import gguf
    import jax
    import numpy as np

    from jaxspec.checkpoint import hf_name

    c = model.config
    kind = gguf.GGMLQuantizationType[qtype]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.head_dim)
    if c.head_dim != c.hidden_size // c.num_attention_heads:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    hf_to_gguf = {
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight",
    }
    layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for path_, leaf in jax.tree_util.tree_leaves_with_path(model.params):
        name, transpose = hf_name(tuple(p.key for p in path_))
        arr = np.asarray(leaf, np.float32)
        arr = arr.T if transpose else arr
        if name in hf_to_gguf:
            gname = hf_to_gguf[name]
        else:
            _, _, idx, *mod, _ = name.split(".")
            gname = f"blk.{idx}.{layer['.'.join(mod)]}.weight"
        if gname.endswith("attn_q.weight"):
            arr = permute_for_gguf(arr, c.num_attention_heads)
        elif gname.endswith("attn_k.weight"):
            arr = permute_for_gguf(arr, c.num_key_value_heads)
        if arr.ndim == 2 and kind != gguf.GGMLQuantizationType.F32:
            if kind == gguf.GGMLQuantizationType.F16:
                w.add_tensor(gname, arr.astype(np.float16))
            else:
                w.add_tensor(gname, gguf.quants.quantize(arr, kind), raw_dtype=kind)
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


def peaked_pair(seeds: tuple[int, int] = (0, 7), scale: float = 3.0) -> tuple[Model, Model]:
    """A float64 target and draft of `tiny_config()`: random weights scaled up so that their
    distributions are peaked and differ, and drafts are both accepted and rejected (the
    edge/verifier tests' pair: exact decisions in float64). Call under `jax.enable_x64`."""
    import jax

    cfg = tiny_config()
    out = []
    for seed in seeds:
        m = Model(config=cfg, params=init_params(cfg, seed))
        spread = m.with_params(jax.tree.map(lambda a: a * scale, m.params))
        out.append(to_dtype(spread, jnp.float64))
    return out[0], out[1]
