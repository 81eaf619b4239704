"""The distilled draft: its config and initialization from the target, the training step
(cross-entropy against the teacher's top-k), and the figures of a draft: KL and greedy
agreement, cost per token, and alpha of co-located speculative decoding."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from trainlib.distill_plan import Plan
from trainlib.steps import adamw, apply_updates, forward, warmup_cosine


def draft_config(target_config: Any, plan: Plan) -> Any:
    heads = max(1, plan.width // 64)
    return dataclasses.replace(
        target_config, hidden_size=plan.width, intermediate_size=plan.width * 5 // 2,
        num_hidden_layers=plan.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=plan.width // heads,
    )  # fmt: skip


def init_draft(target: Any, config: Any, seed: int) -> Any:
    """Random layers; the tied table is the target's, projected on its `width` principal
    directions (so the draft starts out knowing which tokens are alike)."""
    import jax.numpy as jnp

    from jaxspec.nn.model import init_params

    params = init_params(config, seed=seed)
    table = np.asarray(target.params["embed_tokens"]["embedding"], np.float32)  # [V, 576]
    centered = table - table.mean(0)
    _, _, vt = np.linalg.svd(centered[:: max(1, len(table) // 8192)], full_matrices=False)
    proj = centered @ vt[: config.hidden_size].T  # [V, W]
    proj *= 0.02 / proj.std()
    return {**params, "embed_tokens": {"embedding": jnp.asarray(proj, jnp.float32)}}


def train_step_fn(config: Any, plan: Plan) -> Any:
    """Jitted (params, opt_state, tokens, valid, ids, logp, lr) -> (params, opt_state, loss)."""
    import jax
    import jax.numpy as jnp

    opt = adamw(1.0, 0.05)

    def loss_fn(params, toks, valid, ids, logp):
        logq = jax.nn.log_softmax(forward(config, params, toks, valid), axis=-1)
        p = jnp.exp(logp.astype(jnp.float32))
        p = p / p.sum(-1, keepdims=True)
        ce = -jnp.sum(p * jnp.take_along_axis(logq, ids, axis=-1), axis=-1)
        w = valid.astype(jnp.float32)
        return jnp.sum(ce * w) / jnp.maximum(w.sum(), 1.0)

    @jax.jit
    def step(params, opt_state, toks, valid, ids, logp, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, toks, valid, ids, logp)
        updates, opt_state = opt.update(grads, opt_state, params)
        return apply_updates(params, updates, lr), opt_state, loss

    return step, opt


def lr_at(step: int, plan: Plan) -> float:
    """Warmup over `plan.warmup` steps, then cosine to a tenth of `plan.lr`."""
    return warmup_cosine(step, plan.steps, plan.lr, plan.warmup, 0.1)


def kl_and_agreement(
    model: Any, toks: np.ndarray, valid: np.ndarray, ids: np.ndarray, logp: np.ndarray,
    mask: np.ndarray, batch: int = 8,
) -> tuple[float, float]:  # fmt: skip
    """Teacher-forced KL(teacher top-k, renormalized || draft) and greedy agreement over the
    positions in `mask` (float32 model or a quantized one: its own forward)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def stats(params, t, v, i, lp):
        B, T = t.shape
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        logits, _ = model.module.apply({"params": params}, t, pos, v, model.init_cache(B, T))
        logq = jax.nn.log_softmax(logits, axis=-1)
        p = jnp.exp(lp.astype(jnp.float32))
        p = p / p.sum(-1, keepdims=True)
        kl = jnp.sum(p * (jnp.log(p + 1e-30) - jnp.take_along_axis(logq, i, axis=-1)), -1)
        return kl, jnp.argmax(logits, -1) == i[..., 0]

    kls, agree, count = 0.0, 0.0, 0
    for s in range(0, len(toks), batch):
        sl = slice(s, s + batch)
        kl, ok = stats(model.params, toks[sl], valid[sl], ids[sl], logp[sl])
        m = mask[sl]
        kls += float(np.sum(np.asarray(kl)[m]))
        agree += float(np.sum(np.asarray(ok)[m]))
        count += int(m.sum())
    return kls / max(1, count), agree / max(1, count)


def seconds_per_token(model: Any, prompt: list[int], new: int, repeats: int = 3) -> float:
    import jaxspec

    jaxspec.generate(model, prompt, new, temperature=0.0)  # compile
    runs = [jaxspec.generate(model, prompt, new, temperature=0.0) for _ in range(repeats)]
    return min(r.stats.wall_s for r in runs) / new


def alpha(target: Any, draft: Any, prompts: list[list[int]], new: int, temperature: float) -> Any:
    """(alpha, mean acceptance length, alpha per draft position) of co-located speculative
    decoding, gamma 4, over `prompts` (one batch)."""
    import jaxspec

    out = jaxspec.generate(
        target, prompts, new, draft=draft, gamma=4, temperature=temperature, seed=1,
        encoding="full",
    )  # fmt: skip
    f = out.stats.figures
    return f.acceptance_rate, f.mean_acceptance_length, list(f.per_position_acceptance)
