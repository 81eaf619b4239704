"""How a weight becomes ints: the W4A16 (and int8 head) quantizers, in numpy, outside jit.

Every method of `METHODS` is asymmetric and group-wise along the contraction axis K of a
`[K, M]` weight (the layout `jaxspec.quantize` stores): each (group, output column) has a
float16 `scale` and `minimum` (as GGUF's Q4_1 keeps them), and with h = 2^(b-1)

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

One symmetric method (`SYMMETRIC`), for the head (`jaxspec.quantize(head_method=...)`):

    "absmax"  GGUF's Q8_0 rule at any bits: per (group, column) d = max|w| / (2^(b-1) - 1)
              in float32, q = round-half-away-from-zero(w * (1 / d)) (q = 0 where d = 0),
              scale = float16(d), no minimum: w ~= scale * q. At 8 bits and group 32 it is
              ggml's `quantize_row_q8_0` bit for bit, so a table that was Q8_0 (SmolLM2's
              tied token embedding) gives back its own ints and scales.

The symmetric absmax method ("rtn", AQT's own calibration) is in `jaxspec.quantize`; these
are the methods AQT 0.9 does not ship (it has no asymmetric calibration, and its GPTQ imports a
package no registry serves). Their output is served through AQT's int dot path all the same.
All are deterministic: no randomness anywhere.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

METHODS = ("gptq", "clip", "asym")
SYMMETRIC = ("absmax",)  # `quantize_weight` also takes these (no minimum stored)
CLIP_GRID = np.linspace(1.0, 0.6, 17)  # range shrink ratios tried by "clip"
PARAM_DTYPE = np.float16  # stored scale and offset
DAMP = 0.01  # GPTQ's dampening, a fraction of the mean diagonal of H
BLOCK = 128  # GPTQ's lazy-batch width (columns of K updated together)
MIN_SCALE = np.float32(2.0**-24)  # the smallest float16 (subnormal)
PIECE_COLUMNS = 3072  # output columns per GPTQ work piece (`quantize_many`)


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One weight's quantization: q int8 [K, M] in [-h, h - 1], scale and minimum float16
    [G, M] with G = ceil(K / group) (module doc); minimum None for a symmetric method
    (`SYMMETRIC`: w ~= scale * q)."""

    q: np.ndarray
    scale: np.ndarray
    minimum: np.ndarray | None
    bits: int

    def dequant(self, group: int) -> np.ndarray:
        """float32 [K, M]: what the served matmul multiplies by."""
        K = self.q.shape[0]
        s = np.repeat(self.scale.astype(np.float32), group, axis=0)[:K]
        if self.minimum is None:
            return self.q.astype(np.float32) * s
        off = offset(self.scale, self.minimum, self.bits)
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


def _clip_search(
    w_gM: np.ndarray, bits: int, weight_g: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`group_params(w.T, bits, weight_g, clip=True)` of float32 rows `w [g, M]`: the same
    arithmetic in the same order (each column's error summed over g one row after another, as
    numpy reduces the transposed view), in place in one buffer: GPTQ's hot spot."""
    lo, hi = w_gM.min(axis=0), w_gM.max(axis=0)
    mid = (lo + hi) / 2
    best_s, best_o = _grid(lo, hi, bits)
    best_err = np.full(lo.shape, np.inf, np.float32)
    h = 2 ** (bits - 1)
    t = np.empty_like(w_gM)
    for r in CLIP_GRID:
        s, o = _grid(mid + (lo - mid) * r, mid + (hi - mid) * r, bits)
        s32 = s.astype(np.float32)
        np.subtract(w_gM, o.astype(np.float32), out=t)
        np.divide(t, s32, out=t)
        np.rint(t, out=t)
        np.clip(t, 0, 2 * h - 1, out=t)
        np.subtract(t, h, out=t)  # q, exact in float32
        np.multiply(t, s32, out=t)
        np.add(t, offset(s, o, bits), out=t)  # dequant(q)
        np.subtract(w_gM, t, out=t)
        np.multiply(t, t, out=t)
        np.multiply(t, weight_g[:, None], out=t)
        err = t.sum(axis=0)
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


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's `roundf` (ties away from zero), which ggml's quantizers use (numpy's `rint` rounds
    ties to even), exactly: floor(|x|) + floor(2 frac(|x|)), whose steps are exact in float
    (floor(|x| + 0.5) is not: it rounds 0.49999997 up)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def quantize_absmax(w_KM: np.ndarray, bits: int, group: int) -> Quantized:
    """Symmetric absmax ("absmax", module doc): GGUF's Q8_0 at 8 bits and group 32. K is
    zero-padded to whole groups (zeros change no group's max)."""
    K, M = w_KM.shape
    G = -(-K // group)
    w = np.zeros((G * group, M), np.float32)
    w[:K] = w_KM
    w_GgM = w.reshape(G, group, M)
    d = np.abs(w_GgM).max(axis=1) / np.float32(2 ** (bits - 1) - 1)  # [G, M] float32
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = round_half_away(w_GgM * inv[:, None, :])  # |q| <= 2^(b-1) - 1 by construction
    q = q.reshape(G * group, M)[:K].astype(np.int8)
    return Quantized(q, d.astype(PARAM_DTYPE), None, bits)


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
    W = _live_rows(np.asarray(w_KM, np.float64), h_KK)
    hdiag = np.diag(h_KK).astype(np.float32)
    return _gptq_columns(W, _inverse_cholesky(h_KK), hdiag, bits, group)


def _live_rows(w_KM: np.ndarray, h_KK: np.ndarray) -> np.ndarray:
    """float64 copy of `w` with the rows no calibration input reaches (H's diagonal 0) zeroed."""
    W = np.array(w_KM, np.float64)
    W[np.diag(h_KK) == 0] = 0.0
    return W


def _gptq_columns(
    W: np.ndarray, U: np.ndarray, hdiag: np.ndarray, bits: int, group: int
) -> Quantized:
    """GPTQ of the columns `W [K, M]` (float64, updated in place) given H's upper inverse
    Cholesky factor `U` and float32 diag(H). Every column's arithmetic is its own (the block
    update's matmul included), so any split of M into pieces gives the same ints."""
    K, M = W.shape
    G = -(-K // group)
    out = Quantized(
        np.empty((K, M), np.int8), np.empty((G, M), PARAM_DTYPE), np.empty((G, M), PARAM_DTYPE),
        bits,
    )  # fmt: skip
    for b0 in range(0, K, BLOCK):
        b1 = min(K, b0 + BLOCK)
        Eb = _gptq_block(W, U, hdiag, b0, b1, group, out)
        W[b1:] -= U[b0:b1, b1:].T @ Eb
    return out


def _gptq_block(
    W: np.ndarray, U: np.ndarray, hdiag: np.ndarray, b0: int, b1: int, group: int,
    out: Quantized,
) -> np.ndarray:  # fmt: skip
    """Rows b0..b1 of GPTQ: each row rounded on its group's grid, its error spread over the
    block's later rows; fills `out` and returns the block's scaled errors (float64)."""
    K = W.shape[0]
    h = 2 ** (out.bits - 1)
    Wb = W[b0:b1].copy()
    Eb = np.zeros_like(Wb)
    tmp = np.empty_like(Wb)
    for i in range(b1 - b0):
        k = b0 + i
        gi = k // group
        if k % group == 0 or i == 0:
            if k % group == 0:
                ge = min(K, k + group)
                rows = Wb[i : i + (ge - k)] if ge <= b1 else np.concatenate([Wb[i:], W[b1:ge]])
                out.scale[gi], out.minimum[gi] = _clip_search(
                    rows.astype(np.float32), out.bits, hdiag[k:ge]
                )
            s = out.scale[gi].astype(np.float32)
            lo = out.minimum[gi].astype(np.float32)
            off = offset(out.scale[gi], out.minimum[gi], out.bits)
        q = np.rint((Wb[i].astype(np.float32) - lo) / s)
        out.q[k] = (np.clip(q, 0, 2 * h - 1) - h).astype(np.int8)
        err = (Wb[i] - (out.q[k] * s + off)) / U[k, k]
        n = b1 - k - 1
        np.multiply(U[k, k + 1 : b1, None], err[None, :], out=tmp[:n])
        Wb[i + 1 :] -= tmp[:n]
        Eb[i] = err
    return Eb


def quantize_weight(
    w_KM: np.ndarray, method: str, bits: int, group: int, h_KK: np.ndarray | None = None
) -> Quantized:
    """One weight by `method` (module doc); "gptq" without a Hessian is "clip"; "absmax"
    takes no Hessian."""
    if method not in METHODS + SYMMETRIC:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS + SYMMETRIC}")
    w = np.asarray(w_KM, np.float32)
    if method == "absmax":
        return quantize_absmax(w, bits, group)
    if method == "gptq" and h_KK is not None:
        return quantize_gptq(w, h_KK, bits, group)
    hdiag = None if h_KK is None else np.diag(h_KK)
    return quantize_rtn(w, bits, group, clip=method != "asym", hdiag_K=hdiag)


@dataclasses.dataclass(frozen=True)
class Job:
    """One weight for `quantize_many`: `w [K, M]`, its Hessian (None: none), bits, group and
    its own method (None: `quantize_many`'s)."""

    w: np.ndarray
    h: np.ndarray | None
    bits: int
    group: int
    method: str | None = None


class _Shared:
    """GPTQ weights that share one Hessian (q/k/v, gate/up: the same input X), their columns
    side by side; H's inverse Cholesky factor computed once, by whichever piece needs it first."""

    def __init__(self, jobs: list[tuple[int, Job]]):
        first = jobs[0][1]
        self.h, self.bits, self.group = first.h, first.bits, first.group
        self.members = [i for i, _ in jobs]
        self.W = np.concatenate([_live_rows(j.w, self.h) for _, j in jobs], axis=1)
        self.cuts = np.cumsum([0] + [j.w.shape[1] for _, j in jobs])
        self.hdiag = np.diag(self.h).astype(np.float32)
        self._u: np.ndarray | None = None
        self._lock = threading.Lock()

    def u(self) -> np.ndarray:
        with self._lock:
            if self._u is None:
                self._u = _inverse_cholesky(self.h)
            return self._u

    def piece(self, c0: int, c1: int) -> Quantized:
        """GPTQ of columns c0..c1 (column-independent: `_gptq_columns`)."""
        return _gptq_columns(self.W[:, c0:c1].copy(), self.u(), self.hdiag, self.bits, self.group)


def _shared_groups(jobs: Sequence[Job], method: str = "gptq") -> list[_Shared]:
    """The GPTQ jobs (those with a Hessian whose method, theirs or `method`, is GPTQ) grouped
    by identical (Hessian, bits, group), in order of first appearance."""
    by_key: dict[tuple, list[tuple[int, Job]]] = {}
    for i, j in enumerate(jobs):
        if j.h is not None and (j.method or method) == "gptq":
            digest = hashlib.sha256(np.ascontiguousarray(j.h).tobytes()).digest()
            key = (digest, j.h.shape, j.h.dtype.str, j.bits, j.group)
            by_key.setdefault(key, []).append((i, j))
    return [_Shared(members) for members in by_key.values()]


def _pieces(groups: list[_Shared]) -> list[tuple[_Shared, int, int]]:
    """(group, c0, c1) work pieces of at most `PIECE_COLUMNS` columns, a group with many
    pieces (the embedding) spread evenly among the others, so weights finish at a steady
    pace rather than the big one last."""
    keyed = []
    singles = [g for g in groups if g.W.shape[1] <= PIECE_COLUMNS]
    rank = {id(g): r for r, g in enumerate(singles)}
    for g in groups:
        M = g.W.shape[1]
        n = -(-M // PIECE_COLUMNS)
        for p in range(n):
            pos = (rank[id(g)] + 0.5) / len(singles) if n == 1 else (p + 0.5) / n
            piece = (g, p * M // n, (p + 1) * M // n)
            keyed.append((pos, len(keyed), piece))
    return [piece for *_, piece in sorted(keyed, key=lambda t: t[:2])]


def _assemble(parts: list[tuple[int, int, Quantized]], c0: int, c1: int, bits: int) -> Quantized:
    """Columns c0..c1 of a group's pieces ((start, end, Quantized) sorted by start)."""
    got = [(a, b, qz) for a, b, qz in parts if a < c1 and b > c0]
    cat = {
        f: np.concatenate([getattr(qz, f) for *_, qz in got], axis=1)
        for f in ("q", "scale", "minimum")
    }
    lo = c0 - got[0][0]
    return Quantized(*(cat[f][:, lo : lo + c1 - c0] for f in ("q", "scale", "minimum")), bits)


def _openblas_threads() -> Callable[[int], contextlib.AbstractContextManager] | None:
    """A context manager setting numpy's OpenBLAS to n threads (restored after), or None where
    numpy's BLAS is not an OpenBLAS this process has loaded (Linux). `quantize_many` runs its
    own threads with BLAS on one each: OpenBLAS threads spin while they wait, and beside a
    pool they only fight it for the cores (on 2 busy cores they doubled the CPU time). Its
    results do not depend on its thread count (checked on the SmolLM2 copy)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and ".so" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("scipy_", ""), ("", "")):
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                return _blas_setter(get, put)
    return None


def _blas_setter(get: Any, put: Any) -> Callable[[int], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def threads(n: int):
        before = get()
        put(n)
        try:
            yield
        finally:
            put(before)

    return threads


def quantize_many(
    jobs: Sequence[Job], method: str, progress: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> list[Quantized]:  # fmt: skip
    """`quantize_weight` of every job, the same ints, faster: GPTQ weights that share a
    Hessian run as one (their columns side by side), every weight is cut into pieces of
    columns, and the pieces run on `workers` threads (numpy's big loops release the GIL;
    default: the CPUs, at most 4). `progress(done)` is called on this thread as each weight
    completes. A job with a method of its own other than GPTQ runs alone, first."""
    result: list[Quantized | None] = [None] * len(jobs)
    done = 0
    for i, j in enumerate(jobs):  # without a Hessian GPTQ is the clipping search
        how = j.method or method
        if how != "gptq" or j.h is None:
            result[i] = quantize_weight(j.w, "clip" if how == "gptq" else how, j.bits, j.group, j.h)
            done += 1
            if progress:
                progress(done)
    groups = _shared_groups(jobs, method)
    if not groups:
        return result  # type: ignore[return-value]
    pieces = _pieces(groups)
    parts: dict[int, list[tuple[int, int, Quantized]]] = {id(g): [] for g in groups}
    left = {id(g): sum(p[0] is g for p in pieces) for g in groups}
    blas = _openblas_threads()
    n = workers or (min(4, os.cpu_count() or 1) if blas else 1)
    with (
        blas(1) if blas and n > 1 else contextlib.nullcontext(),
        concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="gptq") as pool,
    ):
        futures = {pool.submit(g.piece, c0, c1): (g, c0, c1) for g, c0, c1 in pieces}
        for f in concurrent.futures.as_completed(futures):
            g, c0, c1 = futures[f]
            parts[id(g)].append((c0, c1, f.result()))
            left[id(g)] -= 1
            if left[id(g)]:
                continue
            got = sorted(parts.pop(id(g)), key=lambda t: t[0])
            for m, i in enumerate(g.members):
                result[i] = _assemble(got, int(g.cuts[m]), int(g.cuts[m + 1]), g.bits)
                done += 1
                if progress:
                    progress(done)
    return result  # type: ignore[return-value]
