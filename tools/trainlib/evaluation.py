"""The evaluation of the shipped (bf16) pair and the data-only draft on the held-out streams:
perplexities, greedy agreement, expected acceptance at temperature 1."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from trainlib.presets import Preset
from trainlib.steps import forward


@functools.cache
def eval_fn(target_config: Any, draft_config: Any) -> Any:
    """Jitted sums over a batch of windows [B, T+1] with per-window weights [B]."""
    import jax
    import jax.numpy as jnp

    def nll_and_argmax(logp, y):
        return -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0], jnp.argmax(logp, -1)

    @jax.jit
    def fn(t_params, d_params, c_params, batch, weight_B):
        x, y = batch[:, :-1], batch[:, 1:]
        w = jnp.broadcast_to(weight_B[:, None], y.shape)
        t = jax.nn.log_softmax(forward(target_config, t_params, x), axis=-1)
        d = jax.nn.log_softmax(forward(draft_config, d_params, x), axis=-1)
        c = jax.nn.log_softmax(forward(draft_config, c_params, x), axis=-1)
        t_nll, t_arg = nll_and_argmax(t, y)
        d_nll, d_arg = nll_and_argmax(d, y)
        c_nll, c_arg = nll_and_argmax(c, y)
        pt = jnp.exp(t)
        return {
            "positions": w.sum(),
            "target_nll": (t_nll * w).sum(),
            "draft_nll": (d_nll * w).sum(),
            "draft_data_only_nll": (c_nll * w).sum(),
            "target_correct": ((t_arg == y) * w).sum(),
            "draft_agree": ((d_arg == t_arg) * w).sum(),
            "draft_data_only_agree": ((c_arg == t_arg) * w).sum(),
            "draft_accept_t1": (jnp.minimum(pt, jnp.exp(d)).sum(-1) * w).sum(),
            "draft_data_only_accept_t1": (jnp.minimum(pt, jnp.exp(c)).sum(-1) * w).sum(),
        }

    return fn


@functools.cache
def long_eval_fn(config: Any, start: int) -> Any:
    import jax
    import jax.numpy as jnp
    import optax

    @jax.jit
    def fn(params, batch):
        logits = forward(config, params, batch[:, :-1])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
        return nll[:, start:].sum(), jnp.asarray(nll[:, start:].size, jnp.float32)

    return fn


def windows(stream: np.ndarray, length: int, limit: int) -> np.ndarray:
    n = min(limit, len(stream) // length)
    return stream[: n * length].reshape(n, length).astype(np.int32)


def evaluate(
    target: Any,
    draft: Any,
    data_only_params: Any,
    streams: dict[str, np.ndarray],
    preset: Preset,
) -> dict[str, Any]:
    """Metrics of the three models on the held-out streams (one entry per kind, plus all)."""
    fn = eval_fn(target.config, draft.config)
    sums_by_kind: dict[str, dict[str, float]] = {}
    for kind, stream in streams.items():
        win = windows(stream, preset.seq_len + 1, preset.eval_windows)
        sums: dict[str, float] = {}
        for i in range(0, len(win), preset.eval_batch):
            chunk = win[i : i + preset.eval_batch]
            weight = np.zeros((preset.eval_batch,), np.float32)
            weight[: len(chunk)] = 1.0
            pad = np.zeros((preset.eval_batch - len(chunk), win.shape[1]), np.int32)
            out = fn(
                target.params,
                draft.params,
                data_only_params,
                np.concatenate([chunk, pad]),
                weight,
            )
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        if sums:
            sums_by_kind[kind] = sums

    def metrics(s: dict[str, float]) -> dict[str, float]:
        n = s["positions"]
        return {
            "positions": int(n),
            "target_ppl": math.exp(s["target_nll"] / n),
            "draft_ppl": math.exp(s["draft_nll"] / n),
            "draft_data_only_ppl": math.exp(s["draft_data_only_nll"] / n),
            "target_next_token_accuracy": s["target_correct"] / n,
            "greedy_agreement_draft": s["draft_agree"] / n,
            "greedy_agreement_draft_data_only": s["draft_data_only_agree"] / n,
            "expected_acceptance_t1_draft": s["draft_accept_t1"] / n,
            "expected_acceptance_t1_draft_data_only": s["draft_data_only_accept_t1"] / n,
        }

    total: dict[str, float] = {}
    for s in sums_by_kind.values():
        for k, v in s.items():
            total[k] = total.get(k, 0.0) + v
    result: dict[str, Any] = metrics(total)
    result["by_kind"] = {k: metrics(s) for k, s in sums_by_kind.items()}

    if preset.long_eval_windows and preset.max_position_embeddings > preset.seq_len:
        length = preset.max_position_embeddings + 1
        lfn = long_eval_fn(target.config, preset.seq_len)
        win = windows(streams["source"], length, preset.long_eval_windows)
        nll = cnt = 0.0
        for i in range(0, len(win) - preset.eval_batch + 1, preset.eval_batch):
            a, b = lfn(target.params, win[i : i + preset.eval_batch])
            nll, cnt = nll + float(a), cnt + float(b)
        if cnt:
            result[f"target_ppl_positions_{preset.seq_len}_to_{length - 2}"] = math.exp(nll / cnt)
    return result
