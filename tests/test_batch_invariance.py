"""Batch invariance on the CPU (jaxspec.kernels): a position's K/V and logits are the same
bits however the call that computed it was shaped (prefill, verify block, decode; alone or
with batch mates; any KV bucket), so a resumed session continues exactly as an uninterrupted
one, sampled or not (issue 40, break F).

The kernels are held to XLA's output within float32 rounding over Hypothesis-drawn shapes, to
themselves across row subsets bit for bit, and their AVX-512, AVX2 and scalar paths to each
other. The mutant is XLA's path (`Model.kernels=False`): the same model-level checks must find a
difference there, which shows they can fail."""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxspec
from edge.drafter import Drafter
from jaxspec import kernels
from jaxspec.kernels import attention as attention_kernel
from jaxspec.kernels import dense as floatkernel
from jaxspec.kernels.attention import einsum_attention
from jaxspec.nn.model import forward
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from tests.fixtures import blocks_resumed_at_every_point
from verify import LocalVerifier, Scheduler, SchedulerConfig

needs_kernel = pytest.mark.skipif(
    not kernels.available(), reason=f"{kernels.status()} (XLA's path is not invariant)"
)


def test_float_kernel_was_built_when_required():
    """`.ci/run` sets JAXSPEC_REQUIRE_KERNEL=1 (a compiler is there at install): the tests
    below must not skip there."""
    if os.environ.get("JAXSPEC_REQUIRE_KERNEL") != "1":
        pytest.skip("JAXSPEC_REQUIRE_KERNEL=1 not set (.ci/run sets it)")
    assert kernels.available(), kernels.status()


ROWS = (1, 2, 3, 5, 7, 16, 33)
SIZES = ((8, 64), (37, 100), (64, 130), (96, 64))


@contextlib.contextmanager
def isa(name: str):
    kernels.set_isa(name)
    try:
        yield
    finally:
        kernels.set_isa("best")


# ------------------------------------------------------------------------------ the matmul


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(
    n=st.sampled_from(ROWS),
    size=st.sampled_from(SIZES),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    transpose=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_equals_xla_and_is_invariant_to_its_rows(n, size, dtype, transpose, seed):
    """Within float32 rounding of a float64 product; every row's output the same bits in a
    call of a subset of the rows; every narrower path (scalar, AVX2) the same bits as the
    best one (AVX-512 here)."""
    K, M = size
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, K)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((M, K) if transpose else (K, M)), dtype)
    y = np.asarray(floatkernel.matmul(x, w, transpose_w=transpose))
    w64 = np.asarray(w.astype(jnp.float32), np.float64)
    ref = x.astype(np.float64) @ (w64.T if transpose else w64)
    bound = 1e-6 * K * (np.abs(x).astype(np.float64) @ np.abs(w64.T if transpose else w64))
    assert np.all(np.abs(y - ref) <= bound + 1e-30)
    lo = int(rng.integers(0, n))
    part = np.asarray(floatkernel.matmul(x[lo:], w, transpose_w=transpose))
    np.testing.assert_array_equal(part, y[lo:])
    for path in ("scalar", "AVX2", "AVX-512"):
        with isa(path):
            other = np.asarray(floatkernel.matmul(x, w, transpose_w=transpose))
        np.testing.assert_array_equal(other, y, err_msg=path)


@needs_kernel
def test_matmul_leading_dims_gradient_and_refusals():
    """[..., K] inputs; gradients through XLA's dot equal XLA's own; wrong shapes and dtypes
    refused before any kernel runs."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 3, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    assert floatkernel.matmul(x, w).shape == (2, 3, 8)

    def loss(f, x, w):
        return jnp.sum(jnp.sin(f(x, w)))

    got = jax.grad(functools.partial(loss, floatkernel.matmul), argnums=(0, 1))(x, w)
    want = jax.grad(functools.partial(loss, jnp.matmul), argnums=(0, 1))(x, w)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="x must be"):
        floatkernel.matmul(x, w.T)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        floatkernel.matmul(x, w.astype(jnp.float16))


# ------------------------------------------------------------------------------ attention


@needs_kernel
@settings(max_examples=20, deadline=None)
@given(
    b=st.sampled_from((1, 3)),
    t=st.sampled_from((1, 5, 12)),
    s=st.sampled_from((16, 32)),
    seed=st.integers(0, 2**16),
)
def test_attention_equals_xla_and_is_invariant(b, t, s, seed):
    """The attention kernel within float32 rounding of XLA's einsum form; a query's output
    the same bits when computed alone, in a longer block, or over a larger KV bucket; the
    scalar path the same bits as AVX2."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, 2, 3, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((b, 2 * s, 2, 16)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, 2 * s, 2, 16)), jnp.float32)
    pos = jnp.asarray(rng.integers(-1, s, (b, t)), jnp.int32)
    out = np.asarray(attention_kernel.attention(q, k[:, :s], v[:, :s], pos))
    visible = jnp.arange(s)[None, None, :] <= pos[:, :, None]
    ref = np.asarray(einsum_attention(q, k[:, :s], v[:, :s], visible, jnp.float32))
    seen = np.asarray(pos >= 0)  # a query that sees nothing: zeros (XLA: NaN)
    np.testing.assert_allclose(out[seen], ref[seen], rtol=2e-5, atol=2e-5)
    assert np.all(out[~seen] == 0)
    wider = np.asarray(attention_kernel.attention(q, k, v, pos))  # a larger KV bucket
    np.testing.assert_array_equal(wider, out)
    last = np.asarray(attention_kernel.attention(q[:, -1:], k[:, :s], v[:, :s], pos[:, -1:]))
    np.testing.assert_array_equal(last, out[:, -1:])
    with isa("scalar"):
        scalar = np.asarray(attention_kernel.attention(q, k[:, :s], v[:, :s], pos))
    np.testing.assert_array_equal(scalar, out)


@needs_kernel
def test_attention_over_the_whole_cache_reads_the_slices_in_place():
    """`cache_attention` on the stacked cache [L, N, Smax, H, D] (a layer, a slot per row) is
    the same bits as `attention` on the gathered slices, under jit the cache is not copied
    for the call, and a slot out of range is an error, not a read past the cache."""
    rng = np.random.default_rng(7)
    L, N, Smax, S = 3, 4, 48, 32
    cache = [jnp.asarray(rng.standard_normal((L, N, Smax, 2, 16)), jnp.float32) for _ in "kv"]
    q = jnp.asarray(rng.standard_normal((2, 5, 2, 3, 16)), jnp.float32)
    rows, pos = jnp.asarray([3, 1], jnp.int32), jnp.asarray(rng.integers(0, S, (2, 5)), jnp.int32)

    def whole(q, k, v):
        return attention_kernel.cache_attention(q, k, v, 2, rows, pos, S)

    got = np.asarray(jax.jit(whole)(q, *cache))
    k, v = (c[2, rows, :S] for c in cache)
    np.testing.assert_array_equal(got, np.asarray(attention_kernel.attention(q, k, v, pos)))
    hlo = jax.jit(whole).lower(q, *cache).compile().as_text()
    assert " copy(" not in hlo and "gather" not in hlo
    with pytest.raises(Exception, match="slot out of range"):
        attention_kernel.cache_attention(q, *cache, 2, jnp.asarray([0, N], jnp.int32), pos, S)


@needs_kernel
def test_a_sliding_window_sees_the_last_window_positions_in_the_same_bits_at_any_width():
    """With a window W (Gemma 3's local layers), a query at p attends over p-W+1..p: the
    kernel equals the einsum form over that mask (to float32 rounding), a position's output is
    the same bits alone or in a wider block and bucket, and it differs from no window once p
    reaches W (so the window is applied, not ignored)."""
    rng = np.random.default_rng(9)
    L, N, Smax, S, W = 2, 3, 40, 32, 6
    cache = [jnp.asarray(rng.standard_normal((L, N, Smax, 1, 16)), jnp.float32) for _ in "kv"]
    q = jnp.asarray(rng.standard_normal((2, 4, 1, 4, 16)), jnp.float32)
    rows, pos = jnp.asarray([2, 0], jnp.int32), jnp.asarray([[0, 3, 5, 6], [7, 19, 30, 31]])
    got = np.asarray(attention_kernel.cache_attention(q, *cache, 1, rows, pos, S, W))
    k, v = (c[1, rows, :S] for c in cache)
    want = attention_kernel.einsum_attention(q, k, v, attention_kernel.visible(S, pos, W))
    np.testing.assert_allclose(got, np.asarray(want), atol=2e-6)
    alone = attention_kernel.cache_attention(q[:1, 2:3], *cache, 1, rows[:1], pos[:1, 2:3], 8, W)
    np.testing.assert_array_equal(np.asarray(alone)[0, 0], got[0, 2])
    full = np.asarray(attention_kernel.cache_attention(q, *cache, 1, rows, pos, S))
    np.testing.assert_array_equal(full[0, :2], got[0, :2])  # p < W: the window is everything
    assert not np.allclose(full[1], got[1])


@needs_kernel
def test_attention_over_a_bfloat16_cache_reads_it_in_place():
    """A bfloat16 cache is read where it lies, as float32: the same bits as the float32 kernel
    over the cache converted first, on every ISA; no copy or conversion of the cache under
    jit; a cache of two dtypes (or another dtype) is refused."""
    rng = np.random.default_rng(8)
    L, N, Smax, S = 2, 3, 40, 24
    cache = [jnp.asarray(rng.standard_normal((L, N, Smax, 2, 16)), jnp.bfloat16) for _ in "kv"]
    wide = [c.astype(jnp.float32) for c in cache]
    q = jnp.asarray(rng.standard_normal((2, 3, 2, 3, 16)), jnp.float32)
    rows, pos = jnp.asarray([2, 0], jnp.int32), jnp.asarray(rng.integers(0, S, (2, 3)), jnp.int32)

    def whole(q, k, v):
        return attention_kernel.cache_attention(q, k, v, 1, rows, pos, S)

    want = np.asarray(jax.jit(whole)(q, *wide))
    for path in ("scalar", "AVX2", "AVX-512"):
        with isa(path):
            np.testing.assert_array_equal(np.asarray(jax.jit(whole)(q, *cache)), want, path)
    hlo = jax.jit(whole).lower(q, *cache).compile().as_text()
    assert " copy(" not in hlo and "convert" not in hlo and "gather" not in hlo
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        attention_kernel.cache_attention(q, cache[0], wide[1], 1, rows, pos, S)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        attention_kernel.cache_attention(
            q, *(c.astype(jnp.float16) for c in cache), 1, rows, pos, S
        )


# ------------------------------------------------------------------------------ the model

P, S = 30, 64


@functools.cache
def target():
    return jaxspec.load("default")


def _forward(model, tokens, starts, cache, kv_len=None):
    tk = jnp.asarray(np.stack(tokens), jnp.int32)
    T = tk.shape[1]
    pos = jnp.asarray(np.stack([np.arange(s0, s0 + T) for s0 in starts]), jnp.int32)
    valid = jnp.ones(tk.shape, bool)
    if kv_len is None:
        return forward(model.module, model.params, tk, pos, valid, cache, None)
    apply = jax.jit(model.module.apply, static_argnums=(6,))
    return apply({"params": model.params}, tk, pos, valid, cache, None, kv_len)


def differences(model) -> dict[str, bool]:
    """Which shapes of the same positions give different bits (True: they differ)."""
    rng = np.random.default_rng(0)
    toks = rng.integers(0, model.config.vocab_size, P + 1)
    mates = [rng.integers(0, model.config.vocab_size, P) for _ in range(3)]
    one, c_one = _forward(model, [toks[:P]], [0], model.init_cache(1, S))
    _, c_head = _forward(model, [toks[: P - 5]], [0], model.init_cache(1, S))
    block, c_block = _forward(model, [toks[P - 5 : P]], [P - 5], c_head)
    step, _ = _forward(model, [toks[P : P + 1]], [P], c_block)
    whole, _ = _forward(model, [toks[: P + 1]], [0], model.init_cache(1, S))
    batch, c_batch = _forward(model, [toks[:P], *mates], [0] * 4, model.init_cache(4, S))
    bucket, _ = _forward(model, [toks[P - 5 : P]], [P - 5], c_head, kv_len=S // 2)

    def differ(a, b):
        return not np.array_equal(np.asarray(a), np.asarray(b))

    return {
        "prefill vs block (logits)": differ(one[0, P - 5 :], block[0]),
        "prefill vs block (K/V)": differ(c_one.k[:, 0, :P], c_block.k[:, 0, :P])
        or differ(c_one.v[:, 0, :P], c_block.v[:, 0, :P]),
        "prefill vs decode": differ(whole[0, P], step[0, 0]),
        "alone vs batch mates": differ(one[0], batch[0]) or differ(c_one.k[:, 0], c_batch.k[:, 0]),
        "KV bucket": differ(bucket[0], block[0]),
    }


@needs_kernel
def test_a_position_is_the_same_bits_in_every_shape():
    assert not any(differences(target()).values()), differences(target())


@needs_kernel
def test_the_xla_path_mutant_is_caught():
    """Today's path (XLA's dot, reduce and softmax) changes a row's rounding with the call's
    shape: the check above must see it."""
    model = target()
    found = differences(model.with_params(model.params, kernels=False))
    assert sum(found.values()) >= 3, found


# ------------------------------------------------------------------------------ resume

CONFIG = SchedulerConfig(max_sessions=4, max_len=128, max_gamma=4, row_buckets=(1, 2, 4))
PROMPT = tuple((i * 53 + 3) % 4096 for i in range(30))  # the prompt


@needs_kernel
@pytest.mark.parametrize(
    "gamma,encoding,seed",
    [(0, "full", 77), (3, "full", 5), (3, "sparse", 6), (2, "onehot", 9)],
)
def test_sampled_resume_at_every_point_equals_the_uninterrupted_run(gamma, encoding, seed):
    """At T = 0.9, a session whose verifier goes away at its i-th block and that resumes with
    its committed tokens ends with exactly the uninterrupted tokens, for every i."""
    draft = jaxspec.load("default-draft")
    verifier = LocalVerifier(scheduler=Scheduler(target(), CONFIG))
    spec = DraftSpec(gamma=gamma, encoding=encoding) if gamma else DraftSpec(gamma=0)
    config = SessionConfig(
        prompt=PROMPT, max_new_tokens=40, sampling=SamplingSettings(temperature=0.9), seed=seed,
        draft=spec,
    )  # fmt: skip

    drafter = (lambda: Drafter(draft, spec)) if gamma else (lambda: None)
    assert blocks_resumed_at_every_point(verifier, drafter, config) >= 4


@needs_kernel
def test_attention_gradient_is_xlas():
    """Training through the kernel's attention (a custom JVP): XLA's gradient."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((2, 3, 2, 3, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 8, 2, 16)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 8, 2, 16)), jnp.float32)
    pos = jnp.asarray([[3, 4, 5], [5, 6, 7]], jnp.int32)
    visible = jnp.arange(8)[None, None, :] <= pos[:, :, None]

    def kernel(q, k, v):
        return jnp.sum(jnp.sin(attention_kernel.attention(q, k, v, pos)))

    def xla(q, k, v):
        return jnp.sum(jnp.sin(einsum_attention(q, k, v, visible, jnp.float32)))

    got, want = jax.grad(kernel, (0, 1, 2))(q, k, v), jax.grad(xla, (0, 1, 2))(q, k, v)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
