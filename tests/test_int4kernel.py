"""The int4 FFI kernel (jaxspec/kernels/int4.py, csrc/body_int4.inc) against its pure-JAX
reference, under jax.jit; and its own exactness: every instruction set and every row count
give the same bits for a row.

Tolerance: both accumulate in float32, in different orders, and the kernel works with
u = q + 8 in [0, 15] (it sums x * u per group and subtracts 8 * scale * sum(x)), so the terms
it rounds are up to |x| * (|W| + 8 |scale|), W the dequantized weight, even where q = 0.
Elementwise:
    |kernel - reference| <= 1e-5 * (|x| @ (|W| + 8 |S|)),  S the scale repeated per row
(seen: at most 2e-7 of it; against |x| @ |W| alone, mostly-zero q reached 1.2e-5).

Shapes come from a few buckets (each new shape compiles anew); Hypothesis draws the bucket,
the values (uniform int4, mostly zero as real weights are, or the ends of the range with large
activations), the scale dtype, the offset (None or not) and the code path (AVX2 or scalar).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxspec import kernels
from jaxspec.kernels import int4 as int4kernel
from jaxspec.kernels.int4_layout import pack_int4, pack_tiles, unpack_int4

needs_kernel = pytest.mark.skipif(
    not kernels.available(), reason=f"kernel not built: {kernels.status()}"
)
TOL = 1e-5

# (N, K, M, group): N from 1 to 16 (and one past it), odd K, K not a multiple of the group,
# M not a multiple of the 64-column tile, K smaller than one group. The kernel takes rows in
# blocks of 6/5/4/3/2/1: N = 8 (6 + 2), 16 (6 + 6 + 4), 3, 17 (6 + 6 + 5) and 7 (6 + 1) reach
# every block.
BUCKETS = [
    (1, 576, 192, 64),
    (8, 577, 130, 32),
    (16, 129, 65, 128),
    (3, 7, 3, 32),
    (17, 200, 64, 128),
    (7, 64, 70, 64),
]
SCALE_DTYPES = [jnp.bfloat16, jnp.float16, jnp.float32]


def _problem(bucket, seed, dtype, with_offset, values="uniform"):
    N, K, M, group = bucket
    G = -(-K // group)
    rng = np.random.default_rng(seed)
    if values == "extreme":  # the ends of the int4 range and large activations
        q = rng.choice(np.array([-8, 7]), size=(K, M))
        x = rng.choice(np.array([-1e3, 1e3, 0.0]), size=(N, K))
    elif values == "sparse":  # mostly q = 0, as in quantized trained weights
        q = rng.integers(-8, 8, size=(K, M)) * (rng.uniform(size=(K, M)) < 0.1)
        x = rng.normal(size=(N, K))
    else:
        q = rng.integers(-8, 8, size=(K, M))
        x = rng.normal(size=(N, K))
    scale = rng.uniform(1e-3, 0.1, size=(G, M)) * rng.choice([-1, 1], size=(G, M))
    offset = rng.normal(0, 0.05, size=(G, M)) if with_offset else None
    qweight = np.asarray(pack_int4(jnp.asarray(q)))
    return (
        x.astype(np.float32),
        qweight,
        jnp.asarray(scale, dtype),
        None if offset is None else jnp.asarray(offset, dtype),
    )


@functools.partial(jax.jit, static_argnames=("K", "M", "group"))
def _kernel(x, w, scale, offset, *, K, M, group):
    return int4kernel.matmul(x, w, scale, offset, K=K, M=M, group=group)


@functools.partial(jax.jit, static_argnames=("K", "M", "group"))
def _reference(x, qweight, scale, offset, *, K, M, group):
    return int4kernel.reference_matmul(x, qweight, scale, offset, K=K, M=M, group=group)


def _bound(x, qweight, scale, offset, K, group):
    """|x| @ (|W| + 8 |S|) in float64: the size of the terms the kernel rounds."""
    q = unpack_int4(qweight, K).astype(np.float64)
    s = np.repeat(np.asarray(scale.astype(jnp.float32), np.float64), group, axis=0)[:K]
    w = s * q
    if offset is not None:
        w = w + np.repeat(np.asarray(offset.astype(jnp.float32), np.float64), group, axis=0)[:K]
    return np.abs(x.astype(np.float64)) @ (np.abs(w) + 8 * np.abs(s))


@needs_kernel
@settings(max_examples=40)
@given(
    bucket=st.sampled_from(BUCKETS),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(SCALE_DTYPES),
    shift=st.sampled_from(["none", "offset", "minimum"]),
    values=st.sampled_from(["uniform", "sparse", "extreme"]),
    path=st.sampled_from(["AVX-512", "AVX2", "scalar"]),
)
def test_kernel_matches_reference(isa_restored, bucket, seed, dtype, shift, values, path):
    """`shift`: no offset, an offset (W = scale q + offset), or the stored minimum of an
    asymmetric grid (W = scale (q + 8) + minimum)."""
    N, K, M, group = bucket
    x, qweight, scale, offset = _problem(bucket, seed, dtype, shift != "none", values)
    kernels.set_isa(path)
    w = pack_tiles(unpack_int4(qweight, K))
    kw = dict(K=K, M=M, group=group)
    if shift == "minimum":
        got = np.asarray(int4kernel.matmul(x, w, scale, minimum=offset, **kw))
        want = np.asarray(int4kernel.reference_matmul(x, qweight, scale, minimum=offset, **kw))
        offset = (offset.astype(jnp.float32) + 8 * scale.astype(jnp.float32)).astype(offset.dtype)
    else:
        got = np.asarray(_kernel(x, w, scale, offset, **kw))
        want = np.asarray(_reference(x, qweight, scale, offset, **kw))
    assert got.shape == want.shape == (N, M)
    bound = _bound(x, qweight, scale, offset, K, group)
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= TOL * bound + 1e-30), float(np.max(err / (bound + 1e-30)))


def test_the_tiled_layout_is_the_documented_one():
    """Nibble i of word j of (tile t, row k) is q + 8 of column 64 t + 8 i + j."""
    K, M = 3, 130
    q = np.random.default_rng(0).integers(-8, 8, size=(K, M))
    w = pack_tiles(unpack_int4(np.asarray(pack_int4(jnp.asarray(q))), K))
    assert w.dtype == np.uint8 and w.shape == (3, K, 32)
    words = w.view("<u4")  # [T, K, 8]
    for t in range(3):
        for k in range(K):
            for j in range(8):
                for i in range(8):
                    m = 64 * t + 8 * i + j
                    want = q[k, m] + 8 if m < M else 8
                    assert (int(words[t, k, j]) >> (4 * i)) & 15 == want


def test_reference_matches_a_numpy_dequant():
    K, M, group = 77, 9, 32
    x, qweight, scale, offset = _problem((2, K, M, group), 1, jnp.float16, True)
    got = int4kernel.reference_matmul(x, qweight, scale, offset, K=K, M=M, group=group)
    q = unpack_int4(qweight, K).astype(np.float64)
    s = np.repeat(np.asarray(scale, np.float64), group, axis=0)[:K]
    o = np.repeat(np.asarray(offset, np.float64), group, axis=0)[:K]
    np.testing.assert_allclose(got, x @ (s * q + o), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_leading_dims_and_a_flax_module():
    import flax.linen as nn

    K, M, group = 96, 70, 32
    x, qweight, scale, offset = _problem((6, K, M, group), 2, jnp.bfloat16, True)
    w = jnp.asarray(pack_tiles(unpack_int4(qweight, K)))

    class Int4Dense(nn.Module):
        @nn.compact
        def __call__(self, h):
            wq = self.param("w", lambda _: w)
            s = self.param("scale", lambda _: scale)
            o = self.param("offset", lambda _: offset)
            return int4kernel.matmul(h, wq, s, o, K=K, M=M, group=group)

    model = Int4Dense()
    params = model.init(jax.random.key(0), x)
    got = jax.jit(model.apply)(params, x.reshape(2, 3, K))
    want = int4kernel.reference_matmul(x, qweight, scale, offset, K=K, M=M, group=group)
    assert got.shape == (2, 3, M)
    np.testing.assert_allclose(got.reshape(6, M), want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_wrong_shapes_are_refused():
    K, M, group = 64, 64, 32
    x, qweight, scale, _ = _problem((1, K, M, group), 3, jnp.bfloat16, False)
    w = pack_tiles(unpack_int4(qweight, K))
    with pytest.raises(ValueError, match="scale"):
        int4kernel.matmul(x, w, scale[:1], K=K, M=M, group=group)
    with pytest.raises(ValueError, match="w_prepared"):
        int4kernel.matmul(x, qweight, scale, K=K, M=M, group=group)
    with pytest.raises(ValueError, match="x must be"):
        int4kernel.matmul(x[:, :10], w, scale, K=K, M=M, group=group)


def test_status_is_one_line_and_never_raises():
    line = kernels.status()
    assert line.startswith("CPU kernels: ") and "\n" not in line
    assert kernels.available() == ("XLA's ops" not in line)


@pytest.mark.skipif(
    os.environ.get("JAXSPEC_REQUIRE_KERNEL") != "1",
    reason="JAXSPEC_REQUIRE_KERNEL=1 not set (.ci/run sets it: a compiler is there at install)",
)
def test_kernel_was_built_when_required():
    assert kernels.available(), kernels.status()
    assert kernels.isa() in ("AVX-512", "AVX2", "scalar")


@needs_kernel
@settings(max_examples=12, deadline=None)
@given(
    bucket=st.sampled_from(BUCKETS),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(SCALE_DTYPES),
    shift=st.sampled_from(["none", "offset", "minimum"]),
)
def test_every_path_and_row_count_give_the_same_bits(isa_restored, bucket, seed, dtype, shift):
    """Batch invariance and exactness across builds: a row's output is the same bits computed
    among N rows or alone, on AVX-512, AVX2 or the portable build."""
    N, K, M, group = bucket
    x, qweight, scale, offset = _problem(bucket, seed, dtype, shift != "none", "sparse")
    w = pack_tiles(unpack_int4(qweight, K))
    kw = dict(K=K, M=M, group=group)
    if shift == "minimum":
        kw["minimum"], offset = offset, None

    def run(rows):
        return np.asarray(int4kernel.matmul(x[rows], w, scale, offset, **kw))

    want = run(slice(None))
    for path in ("AVX-512", "AVX2", "scalar"):
        kernels.set_isa(path)
        np.testing.assert_array_equal(run(slice(None)), want, err_msg=path)
    kernels.set_isa("best")
    np.testing.assert_array_equal(run(slice(N - 1, N)), want[N - 1 :])
    np.testing.assert_array_equal(run(slice(0, (N + 1) // 2)), want[: (N + 1) // 2])
