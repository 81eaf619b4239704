"""Tiny models that ship with the code: a config, a byte-level tokenizer, random checkpoints.

Nothing can be downloaded from a model hub here, so the CLI's `init-random`, tools and tests
build their checkpoints themselves; nothing here needs more than the package's own
dependencies (no torch). What only the tests use (the transformers/torch oracle checkpoints,
the GGUF writer, the parity configs, the float64 edge/verifier pair) is in tests/fixtures.py.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax.numpy as jnp

from jaxspec.nn.config import FULL, GEMMA3_BLOCK, SLIDING, LlamaConfig
from jaxspec.nn.model import Model, init_params

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


def tiny_gemma3_config(**overrides: Any) -> LlamaConfig:
    """A 3-layer Gemma 3 config (local, global, local; a window of 5 positions, one KV head,
    scores over sqrt(12) where head_dim is 8): every Gemma switch on, compiled in seconds."""
    return tiny_config(
        **{
            **GEMMA3_BLOCK,
            "num_hidden_layers": 3,
            "num_key_value_heads": 1,
            "rope_theta": 1_000_000.0,
            "tie_word_embeddings": True,
            "hidden_act": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 12,
            "sliding_window": 5,
            "layer_types": (SLIDING, FULL, SLIDING),
            "rope_local_theta": 10000.0,
            **overrides,
        },
    )


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
    from jaxspec.ckpts.checkpoint import save

    tok = byte_tokenizer()
    if config is None:
        config = tiny_config(
            vocab_size=len(tok),
            bos_token_id=tok.bos_token_id,
            eos_token_ids=(tok.eos_token_id,),
        )
    model = Model(config=config, params=init_params(config, seed), tokenizer=tok)
    return save(model, path)


def to_dtype(model: Model, dtype: Any) -> Model:
    """The same model with params and activations in `dtype` (e.g. float64 in exact tests)."""
    import jax

    params = jax.tree.map(lambda a: jnp.asarray(a, dtype), model.params)
    return model.with_params(params, dtype=dtype)
