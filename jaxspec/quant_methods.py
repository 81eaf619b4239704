"""How a weight becomes ints: the W4A16 (and int8 head) quantizers, in numpy, outside jit.

Every method here is asymmetric and group-wise along the contraction axis K of a `[K, M]`
weight (the layout `jaxspec.quantize` stores): each (group, output column) has a float16
`scale` and `minimum` (as GGUF's Q4_1 keeps them), and with h = 2^(b-1)

    w[k, m] ~= scale[g, m] * (q[k, m] + h) + minimum[g, m],   g = k // group, q in [-h, h - 1]

that is `scale * q + offset` with offset = minimum + h * scale (float32): the form the served
matmul takes. Storing the minimum rather than the offset keeps a grid that is already exact
exact: a checkpoint that was Q4_1 at group 32 (SmolLM2's GGUF is) comes back bit for bit.

Methods (`METHODS`, best measured first in `docs/quantization.md`):

    "gptq"  GPTQ (Frantar et al. 2022): columns of K quantized in order, each one's rounding
            error spread over the columns not yet quantized through the inverse Hessian
            H = X^T X of the layer's calibration inputs; each group's grid chosen by "clip"
            on the error-updated weights. Needs `hessian`; falls back to "clip" without one.
    "clip"  per-group clipping search: the [min, max] range shrunk by the ratio (of `CLIP_GRID`)
            that minimizes the group's squared error, weighted by diag(H) when given
            (activation-aware), else plain MSE.
    "asym"  min/max round-to-nearest.

The symmetric absmax method ("rtn", AQT's own calibration) is in `jaxspec.quantize`; these
are the methods AQT 0.9 does not ship (it has no asymmetric calibration, and its GPTQ imports a
package no registry serves). Their output is served through AQT's int dot path all the same.
All are deterministic: no randomness anywhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

METHODS = ("gptq", "clip", "asym")
CLIP_GRID = np.linspace(1.0, 0.6, 17)  # range shrink ratios tried by "clip"
PARAM_DTYPE = np.float16  # stored scale and offset
DAMP = 0.01  # GPTQ's dampening, a fraction of the mean diagonal of H
BLOCK = 128  # GPTQ's lazy-batch width (columns of K updated together)
MIN_SCALE = np.float32(2.0**-24)  # the smallest float16 (subnormal)


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One weight's quantization: q int8 [K, M] in [-h, h - 1], scale and minimum float16
    [G, M] with G = ceil(K / group) (module doc)."""

    q: np.ndarray
    scale: np.ndarray
    minimum: np.ndarray
    bits: int

    def dequant(self, group: int) -> np.ndarray:
        """float32 [K, M]: what the served matmul multiplies by."""
        K = self.q.shape[0]
        off = offset(self.scale, self.minimum, self.bits)
        s = np.repeat(self.scale.astype(np.float32), group, axis=0)[:K]
        o = np.repeat(off, group, axis=0)[:K]
        return self.q.astype(np.float32) * s + o


def offset(scale: np.ndarray, minimum: np.ndarray, bits: int) -> np.ndarray:
    """float32 offset of the served form `scale * q + offset` (module doc)."""
    return minimum.astype(np.float32) + np.float32(2 ** (bits - 1)) * scale.astype(np.float32)


def _grid(lo: np.ndarray, hi: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """float16 (scale, minimum) mapping [lo, hi] onto 2^b levels."""
    scale = ((hi - lo) / (2**bits - 1)).astype(PARAM_DTYPE).astype(np.float32)
    scale = np.maximum(scale, MIN_SCALE)  # a flat group: any positive scale is exact
    return scale.astype(PARAM_DTYPE), lo.astype(PARAM_DTYPE)


def _round(w: np.ndarray, scale: np.ndarray, minimum: np.ndarray, bits: int) -> np.ndarray:
    """Nearest level of `w [M, g]` on each row's grid (`scale`, `minimum` [M]): int8 q."""
    s = scale.astype(np.float32)[:, None]
    q = np.rint((w - minimum.astype(np.float32)[:, None]) / s)
    h = 2 ** (bits - 1)
    return (np.clip(q, 0, 2 * h - 1) - h).astype(np.int8)


def _dequant_rows(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, bits: int) -> np.ndarray:
    return q * scale.astype(np.float32)[:, None] + offset(scale, minimum, bits)[:, None]


def group_params(
    w_Mg: np.ndarray, bits: int, weight_g: np.ndarray | None, clip: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) [M] of one group of K, `w [M, g]` one row per output column.

    With `clip`, the range [min, max] shrunk towards its centre by each ratio of `CLIP_GRID`,
    keeping the ratio with the least error sum_k weight_k (w - dequant(q))^2."""
    lo, hi = w_Mg.min(axis=1), w_Mg.max(axis=1)
    if not clip:
        return _grid(lo, hi, bits)
    wk = np.ones(w_Mg.shape[1], np.float32) if weight_g is None else weight_g
    mid = (lo + hi) / 2
    best_s, best_o = _grid(lo, hi, bits)
    best_err = np.full(lo.shape, np.inf, np.float32)
    for r in CLIP_GRID:
        s, o = _grid(mid + (lo - mid) * r, mid + (hi - mid) * r, bits)
        q = _round(w_Mg, s, o, bits)
        deq = _dequant_rows(q, s, o, bits)
        err = ((w_Mg - deq) ** 2 * wk[None, :]).sum(axis=1)
        better = err < best_err
        best_s, best_o = np.where(better, s, best_s), np.where(better, o, best_o)
        best_err = np.where(better, err, best_err)
    return best_s.astype(PARAM_DTYPE), best_o.astype(PARAM_DTYPE)


def quantize_rtn(
    w_KM: np.ndarray, bits: int, group: int, clip: bool, hdiag_K: np.ndarray | None = None
) -> Quantized:
    """Round-to-nearest on each group's grid ("asym" without `clip`, "clip" with it)."""
    K, M = w_KM.shape
    G = -(-K // group)
    q = np.empty((K, M), np.int8)
    scale = np.empty((G, M), PARAM_DTYPE)
    minimum = np.empty((G, M), PARAM_DTYPE)
    for gi in range(G):
        sl = slice(gi * group, min(K, (gi + 1) * group))
        w_Mg = np.ascontiguousarray(w_KM[sl].T, np.float32)
        hd = None if hdiag_K is None else hdiag_K[sl].astype(np.float32)
        scale[gi], minimum[gi] = group_params(w_Mg, bits, hd, clip)
        q[sl] = _round(w_Mg, scale[gi], minimum[gi], bits).T
    return Quantized(q, scale, minimum, bits)


def _inverse_cholesky(h_KK: np.ndarray) -> np.ndarray:
    """Upper Cholesky factor of H^-1 (GPTQ's form), H dampened; float64."""
    h = h_KK.astype(np.float64).copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += DAMP * np.mean(np.diag(h))
    hinv = np.linalg.inv(np.linalg.cholesky(h))  # L^-1
    return np.linalg.cholesky(hinv.T @ hinv).T  # upper factor of H^-1


def quantize_gptq(w_KM: np.ndarray, h_KK: np.ndarray, bits: int, group: int) -> Quantized:
    """GPTQ with lazy batch updates (the reference algorithm, in our [K, M] layout): rows of
    K are quantized in order; each group's grid is chosen by the clipping search on the
    error-updated rows when the group starts."""
    K, M = w_KM.shape
    G = -(-K // group)
    W = np.array(w_KM, np.float64)
    W[np.diag(h_KK) == 0] = 0.0
    U = _inverse_cholesky(h_KK)
    hdiag = np.diag(h_KK).astype(np.float32)
    q = np.empty((K, M), np.int8)
    scale = np.empty((G, M), PARAM_DTYPE)
    minimum = np.empty((G, M), PARAM_DTYPE)
    for b0 in range(0, K, BLOCK):
        b1 = min(K, b0 + BLOCK)
        Wb = W[b0:b1].copy()
        Eb = np.zeros_like(Wb)
        for i in range(b1 - b0):
            k = b0 + i
            if k % group == 0:
                gi, ge = k // group, min(K, k + group)
                rows = Wb[i : i + (ge - k)] if ge <= b1 else np.concatenate([Wb[i:], W[b1:ge]])
                scale[gi], minimum[gi] = group_params(
                    rows.T.astype(np.float32), bits, hdiag[k:ge], clip=True
                )
            gi = k // group
            row = Wb[i][:, None].astype(np.float32)
            q[k] = _round(row, scale[gi], minimum[gi], bits)[:, 0]
            deq = _dequant_rows(q[k][:, None], scale[gi], minimum[gi], bits)[:, 0]
            err = (Wb[i] - deq) / U[k, k]
            Wb[i:] -= np.outer(U[k, k:b1], err)
            Eb[i] = err
        W[b1:] -= U[b0:b1, b1:].T @ Eb
    return Quantized(q, scale, minimum, bits)


def quantize_weight(
    w_KM: np.ndarray, method: str, bits: int, group: int, h_KK: np.ndarray | None = None
) -> Quantized:
    """One weight by `method` (module doc); "gptq" without a Hessian is "clip"."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    w = np.asarray(w_KM, np.float32)
    if method == "gptq" and h_KK is not None:
        return quantize_gptq(w, h_KK, bits, group)
    hdiag = None if h_KK is None else np.diag(h_KK)
    return quantize_rtn(w, bits, group, clip=method != "asym", hdiag_K=hdiag)
