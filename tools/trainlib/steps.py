"""The training steps: the full-sequence forward, the optimizer and its schedule, the jitted
cross-entropy and distillation steps, and the batch of (seed, phase, step)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from trainlib.presets import Preset


def forward(config: Any, params: Any, tokens_BT: Any, valid: Any = None) -> Any:
    """Full-sequence causal forward with XLA's ops (training): float32 logits `[B, T, V]`.
    `valid` `[B, T]` (default: every position) marks the tokens that count."""
    import jax.numpy as jnp

    import jaxspec

    B, T = tokens_BT.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None, :], (B, T))
    if valid is None:
        valid = jnp.ones((B, T), bool)
    cache = jaxspec.init_cache(config, B, T)
    logits, _ = jaxspec.Llama(config, kernels=False).apply(  # training: XLA's ops
        {"params": params}, tokens_BT, positions, valid, cache
    )
    return logits


def adamw(clip_norm: float, weight_decay: float) -> Any:
    """AdamW (b1 0.9, b2 0.95) after global-norm clipping, without the learning rate (it is
    applied in the step, so that one compiled step serves any schedule); no decay on norm
    scales."""
    import jax
    import optax

    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.scale_by_adam(b1=0.9, b2=0.95, eps=1e-8),
        optax.add_decayed_weights(
            weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
        ),
    )


def make_optimizer(preset: Preset) -> Any:
    """The preset's AdamW."""
    return adamw(preset.clip_norm, preset.weight_decay)


def warmup_cosine(step: int, total: int, peak: float, warmup: int, floor: float) -> float:
    """Linear warmup over `warmup` steps (independent of `total`), then cosine to
    `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    cos = 0.5 * (1 + math.cos(math.pi * frac))
    return peak * (floor + (1 - floor) * cos)


def lr_at(step: int, total: int, peak: float, preset: Preset) -> float:
    """The preset's schedule: warmup over `warmup_steps`, cosine to `min_lr_ratio * peak`."""
    return warmup_cosine(step, total, peak, preset.warmup_steps, preset.min_lr_ratio)


def apply_updates(params: Any, updates: Any, lr: Any) -> Any:
    """One optimizer step: `params - lr * updates`."""
    import jax

    return jax.tree.map(lambda p, u: p - lr * u, params, updates)


@functools.cache
def ce_step_fn(config: Any, preset: Preset) -> Any:
    """Jitted (params, opt_state, batch [B, T+1], lr) -> (params, opt_state, loss)."""
    import jax
    import optax

    opt = make_optimizer(preset)

    def loss_fn(params, batch):
        logits = forward(config, params, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    @jax.jit
    def step(params, opt_state, batch, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return apply_updates(params, updates, lr), opt_state, loss

    return step


@functools.cache
def distill_step_fn(teacher_config: Any, config: Any, preset: Preset) -> Any:
    """Jitted (params, opt_state, teacher_params, batch, lr) -> (params, opt_state, loss, kl, ce)
    with loss = (1 - a) KL(teacher || student) + a CE, averaged over positions."""
    import jax
    import jax.numpy as jnp

    opt = make_optimizer(preset)
    alpha = preset.distill_alpha_ce

    def loss_fn(params, teacher_params, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        t_logp = jax.nn.log_softmax(
            jax.lax.stop_gradient(forward(teacher_config, teacher_params, x)), axis=-1
        )
        s_logp = jax.nn.log_softmax(forward(config, params, x), axis=-1)
        kl = jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), axis=-1).mean()
        ce = -jnp.take_along_axis(s_logp, y[..., None], axis=-1).mean()
        return (1 - alpha) * kl + alpha * ce, (kl, ce)

    @jax.jit
    def step(params, opt_state, teacher_params, batch, lr):
        (loss, (kl, ce)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, teacher_params, batch
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        return apply_updates(params, updates, lr), opt_state, loss, kl, ce

    return step


def get_batch(stream: np.ndarray, seed: int, phase: int, step: int, preset: Preset) -> np.ndarray:
    """The batch of (seed, phase, step): `batch` random windows of `seq_len + 1` tokens."""
    rng = np.random.default_rng([seed, phase, step])
    n = preset.seq_len + 1
    starts = rng.integers(0, len(stream) - n + 1, size=preset.batch)
    return np.stack([stream[s : s + n] for s in starts]).astype(np.int32)
