"""Model fixtures only the tests use (plain functions; tests/conftest.py wraps some in pytest
fixtures): transformers/torch oracle checkpoints, GGUF files written the way llama.cpp's
converter writes them, the architectures the parity tests cover, and the float64 target/draft
pair of the edge and verifier tests.

They lived in `jaxspec.ckpts.tiny`, but nothing outside tests/ used them and `write_hf_checkpoint`
needs torch, which no module of the package may need. What the CLI's `init-random` and the
tools use stays there.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxspec.ckpts.tiny import tiny_config, tiny_gemma3_config, to_dtype
from jaxspec.nn.config import LlamaConfig, RopeScaling
from jaxspec.nn.model import Model, init_params
from jaxspec.protocol import Unavailable, VerifyResult


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
    """Architectures the parity tests cover: MHA/GQA/MQA, tied, rope scaling, Qwen2 biases,
    Gemma 3 (sliding window of 5, so the 24-token tests cross its edge)."""
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
        "gemma3": tiny_gemma3_config(),
    }


def permute_for_gguf(w: Any, n_head: int) -> Any:
    """llama.cpp's converter `permute` of Q/K rows `[n_head * d, in]` (halves -> pairs): what
    a GGUF stores, and what `jaxspec.ckpts.gguf_import` must undo."""
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

    from jaxspec.ckpts.checkpoint import hf_name

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


@functools.cache
def peaked_models() -> tuple[Model, Model]:
    """`peaked_pair()` built once per process (its parameters are never changed in place).
    Call under float64: the `x64` fixture of tests/conftest.py."""
    return peaked_pair()


def peaked_config(max_sessions: int = 4, row_buckets: tuple[int, ...] = (1, 2, 4), **kw: Any):
    """The edge/verifier tests' verifier settings: max_len 128, gamma <= 4."""
    from verify import SchedulerConfig

    return SchedulerConfig(
        max_sessions=max_sessions, max_len=128, max_gamma=4, row_buckets=row_buckets, **kw
    )


def peaked_scheduler(max_sessions: int = 4, row_buckets: tuple[int, ...] = (1, 2, 4), **kw: Any):
    """A verifier's `Scheduler` over `peaked_models()`'s target with `peaked_config`. Each
    test module keeps its own (cache it there): sessions and metrics stay within a module."""
    from verify import Scheduler

    return Scheduler(peaked_models()[0], peaked_config(max_sessions, row_buckets, **kw))


def blocks_resumed_at_every_point(verifier, make_drafter, config) -> int:
    """Run `config` on `verifier` uninterrupted, then once for each of its blocks i >= 2 with
    the verifier gone at the i-th (`Recorder(fail_at=i)`): every such run must resume once and
    end with exactly the uninterrupted tokens. Closes `verifier`; returns the uninterrupted
    run's block count. `make_drafter()` gives each run a fresh drafter (None: plain)."""
    import asyncio

    from edge.session import run_session

    async def run(fail_at=None):
        endpoint = verifier if fail_at is None else Recorder(verifier, fail_at)
        trace = await run_session(endpoint, make_drafter(), config, resume_timeout_s=5.0)
        return trace.tokens, trace.resumes, getattr(endpoint, "calls", trace.blocks_sent)

    async def go():
        try:
            full, _, calls = await run()
            for i in range(2, calls + 1):
                tokens, resumes, _ = await run(fail_at=i)
                assert resumes == 1 and tokens == full, (i, tokens, full)
            return calls
        finally:
            await verifier.aclose()

    return asyncio.run(go())


class Recorder:
    """An endpoint that keeps every (block, result) it answered, in answer order, and can
    fail the `fail_at`-th verify call with UNAVAILABLE (a verifier that went away)."""

    def __init__(self, inner, fail_at: int | None = None):
        self.inner, self.fail_at = inner, fail_at
        self.seen: list[tuple[object, VerifyResult]] = []
        self.calls = 0

    async def open_session(self, config):
        return await self.inner.open_session(config)

    async def close_session(self, session_id):
        await self.inner.close_session(session_id)

    async def verify(self, block):
        self.calls += 1
        if self.calls == self.fail_at:
            raise Unavailable("gone")
        r = await self.inner.verify(block)
        self.seen.append((block, r))
        return r


def continuation_logits(target: Model, prompt, n_new: int) -> tuple[np.ndarray, np.ndarray]:
    """Every continuation of `n_new - 1` tokens after `prompt` ([S, n_new-1] int) and the
    target's float64 logits at the `n_new` positions that sample them ([S, n_new, V]): what an
    exact law of `n_new` sampled tokens is built from."""
    import itertools

    import jax

    V = target.config.vocab_size
    with jax.enable_x64(True):
        m = to_dtype(target, jnp.float64)
        conts = np.array(list(itertools.product(range(V), repeat=n_new - 1)))
        seqs = np.concatenate([np.tile(prompt, (len(conts), 1)), conts], axis=1)
        T = seqs.shape[1]
        logits, _ = m(seqs, np.broadcast_to(np.arange(T), seqs.shape), m.init_cache(len(seqs), T))
        return conts, np.asarray(logits[:, len(prompt) - 1 :], np.float64)


def gguf_oracle(remote: Any) -> Any:
    """transformers' own GGUF import (float32, eval mode) of the file a fetched model (`hub`'s
    `RemoteModel`) was converted from: the real models' parity oracle."""
    import torch
    from transformers import AutoModelForCausalLM

    from jaxspec_host import hub

    g = hub.gguf_path(remote)
    return AutoModelForCausalLM.from_pretrained(
        str(g.parent), gguf_file=g.name, dtype=torch.float32
    ).eval()
