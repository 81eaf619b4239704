"""The two layouts of packed int4 weights, written once (jnp; usable under jit and outside).

Rows (`pack_int4`, the checkpoint layout of files written before tiles): uint8
[ceil(K/2), M]; row i holds q[i] in the low nibble and q[i + ceil(K/2)] in the high nibble
(two's complement; zero pad for odd K).

Tiles (`pack_tiles`, what the int4 kernel `jaxspec.kernels.int4` reads and what a quantized
model stores): uint8 [T, K, 32], T = ceil(M / 64) tiles of 64 output columns (M padded with
q = 0). The 32 bytes of (t, k) are 8 little-endian uint32 words; nibble i (bits 4i..4i+3) of
word j holds q + 8 (0..15) for column 64 t + 8 i + j. Each tile is contiguous (K * 32 bytes,
streamed front to back), and one 256-bit load plus a shift and a mask gives 8 contiguous
columns as int32 lanes.

A rows-layout weight becomes the kernel's with `pack_tiles(unpack_int4(qweight, K))`, once,
at load time; hand the result to jitted code as an argument, not as a closed-over constant
(XLA would embed it in the program). `pack_int4`, `unpack_int4` and `pack_tiles` give numpy
arrays for numpy ones (on the host, no dispatch per shape) and jax arrays otherwise (under
jit): the same bytes either way.

Pure module: imports only jax and numpy.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

TILE = 64  # output columns per tile of the tiled layout


def _xp(a: object) -> types.ModuleType:
    """numpy for a numpy array, jax.numpy for anything else (a jax array, a tracer)."""
    return np if isinstance(a, np.ndarray | np.generic) else jnp


def pack_int4(q_KM: jax.Array) -> jax.Array:
    """Pack int values in [-8, 7] two per byte along axis 0: `[K, ...]` -> uint8 `[ceil(K/2), ...]`.

    Row i of the result holds `q[i]` (low nibble) and `q[i + ceil(K/2)]` (high nibble; zero
    when K is odd and i is the last row)."""
    xp = _xp(q_KM)
    K = q_KM.shape[0]
    h = -(-K // 2)
    q = xp.asarray(q_KM).astype(xp.int8)
    q = xp.pad(q, [(0, 2 * h - K)] + [(0, 0)] * (q.ndim - 1))
    lo = q[:h].astype(xp.uint8) & xp.uint8(0xF)
    hi = q[h:].astype(xp.uint8) & xp.uint8(0xF)
    return lo | (hi << xp.uint8(4))


def unpack_int4(packed: jax.Array, K: int) -> jax.Array:
    """Inverse of `pack_int4`: uint8 `[ceil(K/2), ...]` -> int8 `[K, ...]` in [-8, 7]."""
    xp = _xp(packed)
    p = xp.asarray(packed, xp.uint8)
    if p.ndim < 1 or p.shape[0] != -(-K // 2):
        raise ValueError(f"packed int4 must be uint8 [ceil(K/2)={-(-K // 2)}, ...], got {p.shape}")
    nibbles = xp.concatenate([p & xp.uint8(0xF), p >> xp.uint8(4)], axis=0)[:K]
    return (nibbles.astype(xp.int8) ^ xp.int8(8)) - xp.int8(8)  # sign-extend 4 bits


def pack_tiles(q_KM: jax.Array) -> jax.Array:
    """int values in [-8, 7] `[K, M]` -> the tiled layout uint8 `[ceil(M/64), K, 32]` that
    the int4 kernel reads (module doc): for tile t and row k, 8 little-endian uint32 words,
    nibble i of word j = q + 8 of column 64 t + 8 i + j (M padded with q = 0)."""
    xp = _xp(q_KM)
    K, M = q_KM.shape
    T = -(-M // TILE)
    u = xp.asarray(q_KM).astype(xp.int32) + 8
    u = xp.pad(u, ((0, 0), (0, T * TILE - M)), constant_values=8).astype(xp.uint8)
    u = u.reshape(K, T, 8, 8).transpose(1, 0, 3, 2)  # [T, K, j (word), i (nibble)]
    u = u.reshape(T, K, 8, 4, 2)  # nibble i = 2 b + h sits in byte b of its word
    return (u[..., 0] | (u[..., 1] << xp.uint8(4))).reshape(T, K, 32)


def _tile_nibbles(tiles: jax.Array) -> jax.Array:
    """uint8 `[..., K, 32]` tile rows -> int8 q `[..., K, 64]` (column 8 i + j of the tile)."""
    b = tiles.reshape(*tiles.shape[:-1], 8, 4)  # [..., j, byte]
    nib = jnp.stack([b & jnp.uint8(0xF), b >> jnp.uint8(4)], axis=-1)  # [..., j, byte, h]
    nib = nib.reshape(*tiles.shape[:-1], 8, 8)  # [..., j, i]
    q = jnp.swapaxes(nib, -1, -2).reshape(*tiles.shape[:-1], TILE)  # [..., 8 i + j]
    return q.astype(jnp.int8) - jnp.int8(8)


def unpack_tiles(tiles: jax.Array, M: int) -> jax.Array:
    """Inverse of `pack_tiles`: uint8 `[T, K, 32]` -> int8 `[K, M]`."""
    T, K, _ = tiles.shape
    return _tile_nibbles(tiles).transpose(1, 0, 2).reshape(K, T * TILE)[:, :M]


def take_tile_columns(tiles: jax.Array, cols: jax.Array) -> jax.Array:
    """Columns `cols [N]` of a tiled weight as int8 `[K, N]` (the embedding lookup), reading
    only their tiles."""
    q = _tile_nibbles(jnp.take(tiles, cols // TILE, axis=0))  # [N, K, 64]
    idx = jnp.broadcast_to((cols % TILE)[:, None, None], (*q.shape[:2], 1))
    return jnp.take_along_axis(q, idx, axis=2)[..., 0].T
