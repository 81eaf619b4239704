"""The int8 FFI kernel (jaxspec/kernels/int8.py, csrc/body_int8.inc): within float32 rounding
of its XLA reference over Hypothesis-drawn shape buckets, scale dtypes and values; a row's
output the same bits alone or among others and on every instruction set; wrong shapes refused.

Tolerance: both sum in float32 in different orders (the kernel per group, then the scales),
so elementwise |kernel - reference| <= 1e-5 * (|x| @ |W|) + tiny."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec import kernels
from jaxspec.kernels import int8

needs_kernel = pytest.mark.skipif(not kernels.available(), reason=kernels.status())

# (N, K, M, group): one row; a verify block; K not a multiple of the group; M not a multiple
# of a vector; many rows (blocks of 4 + a rest)
BUCKETS = [(1, 576, 192, 32), (5, 64, 130, 32), (3, 77, 33, 32), (9, 128, 64, 64)]
SCALES = [jnp.float16, jnp.bfloat16, jnp.float32]


def _problem(bucket, seed, dtype):
    N, K, M, group = bucket
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.integers(-127, 128, (K, M)), jnp.int8)
    scale = jnp.asarray(rng.uniform(1e-3, 2e-2, (-(-K // group), M)), dtype)
    x = rng.standard_normal((N, K)).astype(np.float32)
    return x, q, scale


@needs_kernel
@settings(max_examples=16, deadline=None)
@given(
    bucket=st.sampled_from(BUCKETS),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(SCALES),
)
def test_kernel_matches_reference_and_is_invariant(isa_restored, bucket, seed, dtype):
    N, K, M, group = bucket
    x, q, scale = _problem(bucket, seed, dtype)
    got = np.asarray(int8.matmul(x, q, scale, group=group))
    want = np.asarray(int8.reference_matmul(x, q, scale, group=group), np.float64)
    w = np.repeat(np.asarray(scale, np.float64), group, axis=0)[:K] * np.asarray(q, np.float64)
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w)) + 1e-30
    assert got.shape == (N, M) and np.all(np.abs(got - want) <= bound)
    for path in ("AVX2", "scalar"):
        kernels.set_isa(path)
        np.testing.assert_array_equal(np.asarray(int8.matmul(x, q, scale, group=group)), got)
    kernels.set_isa("best")
    np.testing.assert_array_equal(np.asarray(int8.matmul(x[-1:], q, scale, group=group)), got[-1:])


@needs_kernel
def test_leading_dims_and_refusals():
    x, q, scale = _problem((6, 64, 40, 32), 1, jnp.float16)
    got = int8.matmul(x.reshape(2, 3, 64), q, scale, group=32)
    assert got.shape == (2, 3, 40)
    with pytest.raises(ValueError, match="q must be int8"):
        int8.matmul(x, q.astype(jnp.int32), scale, group=32)
    with pytest.raises(ValueError, match="scale must be"):
        int8.matmul(x, q, scale[:1], group=32)
