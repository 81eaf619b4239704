"""The distillation's data: the target's own answers, plain text windows, padding and length
buckets, and the teacher's top-k log-probabilities of every position."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainlib import corpus
from trainlib.distill_plan import Plan
from trainlib.prompts import Prompt


def answer(target: Any, prompts: list[tuple[int, ...]], plan: Plan, seed: int, bar: Any) -> Any:
    """The target's own answers (new tokens, EOS kept), half greedy, half at T=0.7."""
    import jaxspec

    answers: list[list[int]] = []
    for i in range(0, len(prompts), plan.answer_batch):
        chunk = [list(p) for p in prompts[i : i + plan.answer_batch]]
        temps = [0.0 if (i + j) % 2 == 0 else 0.7 for j in range(len(chunk))]
        out = jaxspec.generate(
            target, chunk, plan.answer_tokens, temperature=temps,
            seeds=[seed * 100003 + i + j for j in range(len(chunk))],
        )  # fmt: skip
        answers += out.tokens
        bar(len(chunk))
    return answers


def plain_windows(tokenizer: Any, plan: Plan, seed: int, held: list[Prompt]) -> list[list[int]]:
    """Windows of ordinary text (pydoc topics, stdlib sources): training documents only,
    none that a held-out prompt was built from."""
    rng = np.random.default_rng([seed, 7])
    exclude = {p.source for p in held}
    docs = [d for d in corpus.pydoc_documents() + corpus.stdlib_documents()]
    docs = [d for d in docs if not corpus.is_heldout(d.name) and d.name not in exclude]
    out = []
    for i in rng.permutation(len(docs)):
        ids = tokenizer.encode(docs[i].text, add_special_tokens=False)
        if len(ids) >= plan.seq_len:
            s = int(rng.integers(0, len(ids) - plan.seq_len + 1))
            out.append(ids[s : s + plan.seq_len])
        if len(out) == plan.plain_windows:
            break
    return out


def pad(seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """tokens [N, length] int32 (0-padded) and valid [N, length] bool."""
    toks = np.zeros((len(seqs), length), np.int32)
    valid = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        s = list(s)[:length]
        toks[i, : len(s)] = s
        valid[i, : len(s)] = True
    return toks, valid


def bucketize(seqs: Sequence[Sequence[int]], plan: Plan) -> dict[int, list[list[int]]]:
    """Sequences by length bucket (multiples of 64 up to `seq_len` inputs): batches of one
    bucket waste little on padding (chat sequences are ~half of `seq_len`)."""
    out: dict[int, list[list[int]]] = {}
    for s in seqs:
        s = list(s)[: plan.seq_len + 1]
        T = min(plan.seq_len, -(-(len(s) - 1) // 64) * 64)
        out.setdefault(T, []).append(s)
    return dict(sorted(out.items()))


def teacher_topk(
    target: Any, toks: np.ndarray, valid: np.ndarray, k: int, bar: Any, batch: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """The target's top-k next-token ids [N, T, k] int32 and log-probs [N, T, k] float16."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def top(params, t, v):
        B, T = t.shape
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        cache = target.init_cache(B, T)
        logits, _ = jaxspec_forward(target, params, t, pos, v, cache)
        logp = jax.nn.log_softmax(logits, axis=-1)
        vals, ids = jax.lax.top_k(logp, k)
        return ids, vals.astype(jnp.float16)

    ids_all, lp_all = [], []
    for i in range(0, len(toks), batch):
        t, v = toks[i : i + batch], valid[i : i + batch]
        n = len(t)
        if n < batch:  # one compiled shape
            t = np.concatenate([t, np.zeros((batch - n, t.shape[1]), np.int32)])
            v = np.concatenate([v, np.zeros((batch - n, v.shape[1]), bool)])
        ids, lp = top(target.params, t, v)
        ids_all.append(np.asarray(ids)[:n])
        lp_all.append(np.asarray(lp)[:n])
        bar(n)
    return np.concatenate(ids_all), np.concatenate(lp_all)


def jaxspec_forward(model: Any, params: Any, t: Any, pos: Any, v: Any, cache: Any) -> Any:
    return model.module.apply({"params": params}, t, pos, v, cache)
