"""Calibration data for GPTQ, built offline: chat prompts from what ships with CPython, the
model's own answers to them, and each linear layer's input Hessian H = X^T X.

The prompts come from `pydoc_data.topics` (the language reference's help topics) and from
the docstrings of the standard library's modules: on every machine with Python, nothing to
download. Half the answers are greedy, half sampled at T = 0.7, so the activations look like
the model's real work (chat turns of its own text). Prompts whose source the evaluation holds
out (`is_heldout`) are never used here: `tools/quality_w4a16.py` evaluates on those.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import re
import sysconfig
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.nn.model import Llama, Model, init_cache

Progress = Callable[[str, int, int], None]
HELDOUT_PERCENT = 20  # sources (topics, modules) kept for evaluation, by hash


@dataclasses.dataclass(frozen=True)
class Plan:
    """How much calibration: `prompts` chats of up to `answer_tokens` new tokens, packed into
    windows of `window` tokens, `batch` windows per forward."""

    prompts: int = 32
    answer_tokens: int = 80
    window: int = 256
    batch: int = 8
    seed: int = 0


def is_heldout(source: str) -> bool:
    """Whether a prompt source (e.g. "pydoc/for", "stdlib/json") is kept for evaluation."""
    return int(hashlib.sha256(source.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


_DOCSTRING = re.compile(r'^(?:\s*#[^\n]*\n|\s*\n)*\s*[rRuU]?("""|\'\'\')(.*?)\1', re.DOTALL)


@functools.cache
def _module_docs() -> list[tuple[str, str]]:
    """(module name, first docstring paragraph) of the standard library's top-level modules."""
    base = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(base.glob("*.py")):
        try:
            m = _DOCSTRING.match(path.read_text(encoding="utf-8")[:16384])
        except (UnicodeDecodeError, OSError):
            continue
        para = " ".join(m.group(2).strip().split("\n\n")[0].split()) if m else ""
        if 40 <= len(para) <= 600:
            out.append((path.stem, para))
    return out


def chat_prompts(n: int, seed: int = 0, heldout: bool = False) -> list[tuple[str, str]]:
    """`n` (source, prompt) pairs in a seeded order: explanations of Python help topics,
    summaries and rewrites of their paragraphs, and questions on stdlib modules. With
    `heldout`, from the held-out sources instead (for evaluation)."""
    from pydoc_data.topics import topics

    items = []
    for name in sorted(topics):
        paras = [" ".join(p.split()) for p in topics[name].split("\n\n")]
        paras = [p for p in paras if 150 <= len(p) <= 500 and p[0].isalpha()]
        items.append((f"pydoc/{name}", f"Explain '{name}' in Python to a beginner."))
        for p in paras[:1]:
            items.append((f"pydoc/{name}", f"Summarize this text in two sentences:\n\n{p}"))
        for p in paras[1:2]:
            items.append((f"pydoc/{name}", f"Rewrite this text in simpler words:\n\n{p}"))
    for mod, para in _module_docs():
        items.append((f"stdlib/{mod}", f"What is the Python module `{mod}` for? {para[:200]}"))
        items.append((f"stdlib/{mod}", f"Write a short Python example that uses `{mod}`."))
    items = [it for it in items if is_heldout(it[0]) == heldout]
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order[:n]]


def prompt_ids(model: Model, text: str) -> tuple[int, ...]:
    """The prompt as the model is asked it: through its chat template when it has one; a
    model without a tokenizer gets the text's UTF-8 bytes (modulo its vocabulary)."""
    from jaxspec.nn.text import chat_prompt, encode_prompt

    tok = model.tokenizer
    if tok is None:
        return tuple(b % model.config.vocab_size for b in text.encode()[:64])
    if getattr(tok, "chat_template", None):
        return chat_prompt(model, text)
    return encode_prompt(model, text)


def default_sequences(
    model: Model, plan: Plan = Plan(), progress: Progress | None = None
) -> list[list[int]]:
    """Chat prompts and the model's own answers (prompt + answer ids), `plan.prompts` of them."""
    from jaxspec.decoding.generate import generate

    prompts = [prompt_ids(model, t) for _, t in chat_prompts(plan.prompts, plan.seed)]
    out: list[list[int]] = []
    if progress:  # the stage has begun (generate reports nothing until its call returns)
        progress("answers", 0, len(prompts))
    step = 32  # rows per generate call: one compilation for the default plan
    for i in range(0, len(prompts), step):
        chunk = [list(p) for p in prompts[i : i + step]]
        temps = [0.0 if (i + j) % 2 == 0 else 0.7 for j in range(len(chunk))]
        seeds = [plan.seed * 1009 + i + j for j in range(len(chunk))]
        res = generate(model, chunk, plan.answer_tokens, temperature=temps, seeds=seeds)
        out += [p + list(a) for p, a in zip(chunk, res.tokens, strict=True)]
        if progress:
            progress("answers", len(out), len(prompts))
    return out


def windows(seqs: Sequence[Sequence[int]], window: int) -> np.ndarray:
    """The sequences packed end to end and cut into whole windows: int32 [W, window]."""
    stream = np.concatenate([np.asarray(s, np.int32) for s in seqs])
    W = max(1, len(stream) // window)
    stream = np.resize(stream, W * window)  # a stream shorter than one window repeats
    return stream.reshape(W, window)


class _Probe(nn.Module):
    """`nn.Dense` (same params) that also adds its inputs' x^T x to the "hessian" collection."""

    features: int
    use_bias: bool = True
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        K = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (K, self.features))
        x2 = x.reshape(-1, K).astype(jnp.float32)
        self.sow("hessian", "xtx", x2.T @ x2, init_fn=lambda: 0.0, reduce_fn=jnp.add)
        y = x @ kernel.astype(self.dtype)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros_init(), (self.features,))
        return y


def _probe_factory(features: int, *, use_bias: bool = True, dtype: Any = jnp.float32,
                   dot_general_cls: Any = None, name: str | None = None) -> nn.Module:  # fmt: skip
    return _Probe(features, use_bias, dtype, name=name)


@functools.partial(jax.jit, static_argnames=("module",))
def _xtx(module: Any, params: Any, toks: jax.Array) -> Any:
    B, T = toks.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    cache = init_cache(module.config, B, T, module.dtype)
    _, v = module.apply(
        {"params": params}, toks, pos, toks > -1, cache, mutable=["hessian", "intermediates"],
        capture_intermediates=lambda mdl, method: mdl.name == "norm" and method == "__call__",
    )  # fmt: skip
    out = dict(v["hessian"])
    if module.config.tie_word_embeddings:  # the tied head's input: the final norm's output
        x = v["intermediates"]["norm"]["__call__"][0]
        x2 = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
        out["embed_tokens"] = {"xtx": x2.T @ x2}
    return out


def compiled_probe(model: Model, plan: Plan = Plan()) -> Callable[[Any, jax.Array], Any]:
    """The probe forward of one whole batch (`plan.batch` windows) that `hessians` runs,
    compiled ahead: `jaxspec.quantize` compiles it on a second thread while the answers are
    being generated (XLA compiles on one core). The same program as `hessians` compiles."""
    shape = jax.ShapeDtypeStruct((plan.batch, plan.window), jnp.int32)
    return _xtx.lower(_probe_module(model), model.params, shape).compile()


def _probe_module(model: Model) -> Llama:
    return Llama(model.config, model.dtype, None, _probe_factory, None)


def hessians(
    model: Model, seqs: Sequence[Sequence[int]], plan: Plan = Plan(),
    progress: Progress | None = None, probe: Callable[[Any, jax.Array], Any] | None = None,
) -> dict[tuple[str, ...], np.ndarray]:  # fmt: skip
    """Each linear layer's H = X^T X / tokens (float64 [K, K]) over `seqs` packed into
    windows, keyed by the layer's param path (e.g. ("layers_0", "mlp", "up_proj")); a tied
    head's (the final norm's output) under ("embed_tokens",). `probe`: `compiled_probe`'s
    result for this model and plan, used for whole batches."""
    module = _probe_module(model)
    wins = windows(seqs, plan.window)
    if len(wins) > plan.batch:  # whole batches only: one compiled shape
        wins = wins[: len(wins) // plan.batch * plan.batch]
    total: dict[tuple[str, ...], np.ndarray] = {}
    if progress:
        progress("hessians", 0, len(wins))
    for i in range(0, len(wins), plan.batch):
        toks = jnp.asarray(wins[i : i + plan.batch])
        whole = probe is not None and toks.shape == (plan.batch, plan.window)
        sown = probe(model.params, toks) if whole else _xtx(module, model.params, toks)
        for path, leaf in jax.tree_util.tree_flatten_with_path(sown)[0]:
            keys = tuple(str(p.key) for p in path)[:-1]  # drop the "xtx" leaf name
            total[keys] = total.get(keys, 0.0) + np.asarray(leaf, np.float64)
        if progress:
            progress("hessians", min(len(wins), i + plan.batch), len(wins))
    n = wins.size
    return {k: v / n for k, v in total.items()}
