"""Every use of AQT (google/aqt, `aqtp`) lives in this module.

AQT's README says it is reaching end-of-life in favour of qwix; `jaxspec.quantize` talks to
AQT only through the few functions below, so a later move touches this file alone.

What we use, all from `aqt.jax.v2` (AQT 0.9.0):
- `config.dot_general_make(lhs_bits=..., rhs_bits=...)`: the quantized dot_general config
  (rhs = weights, lhs = activations; `lhs_bits=None` keeps activations in float), symmetric
  int numerics with absmax calibration. For the weights we set `preserve_max_val=True` and
  bfloat16 scales: scale = bf16(absmax / (2^(b-1) - 1)), q = round_half_even(clip(w *
  bf16(1/scale), -(2^(b-1) - 1), 2^(b-1) - 1)), so each group's largest weight is exact.
  AQT's default (`preserve_max_val=False`) maps absmax to 2^(b-1) - 1/2 and then clips it to
  2^(b-1) - 1, shrinking the largest weights by 1/15 at 4 bits; on the shipped target that
  doubled the held-out perplexity cost of w4a16 g128 (+0.62% against +0.29%). Activations
  (w4a4) keep AQT's default numerics, per row and group, computed on the fly;
- `tiled_dot_general.Cfg`: group-wise (sub-channel) scales by tiling the contraction axis;
- `flax.aqt_flax.AqtDotGeneral` in the TRAIN (fake-quant), CONVERT (freeze int weights and
  scales into the "aqt" collection) and SERVE (use given int weights) modes;
- `aqt_quantizer.quantizer_make`: the same numerics applied to an embedding table (a lookup
  is not a dot_general, so there is nothing to intercept).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from aqt.jax.v2 import aqt_quantizer, aqt_tensor, tiled_dot_general
from aqt.jax.v2 import config as aqt_config
from aqt.jax.v2.flax import aqt_flax
from aqt.jax.v2.numerics import utils as numerics_utils
from aqt.jax.v2.utils import QuantMode

SCALE_DTYPE = jnp.bfloat16
COLLECTION = "aqt"  # where CONVERT freezes the int weights and scales
_MODES = {"train": QuantMode.TRAIN, "convert": QuantMode.CONVERT, "serve": QuantMode.SERVE}


@functools.cache
def _config(weight_bits: int, act_bits: int | None) -> Any:
    cfg = aqt_config.dot_general_make(lhs_bits=act_bits, rhs_bits=weight_bits)
    cfg.fwd.dg_quantizer.rhs.numerics = numerics_utils.get_numerics(
        weight_bits, preserve_max_val=True
    )
    cfg.fwd.dg_quantizer.rhs.scale_dtype = SCALE_DTYPE
    return cfg


def qvalue_dtype(bits: int) -> Any:
    """The integer dtype AQT gives a `bits`-bit weight (int4 or int8)."""
    return _config(bits, None).fwd.dg_quantizer.rhs.numerics.get_dtype()


def _tiling(group: int) -> Any:
    """Tile the contraction axis of `x [N, K] @ w [K, M]` into groups of `group`."""
    tdg = tiled_dot_general

    def side(axis: int) -> Any:
        tiling = tdg.AxisTiling(axis=axis, tile_size=group)
        return tdg.TensorTiling(contraction_axes=[tiling], remaining_axes=[])

    return tdg.Cfg(lhs=side(1), rhs=side(0))


def matmul(
    x_NK: jax.Array,
    w_KM: jax.Array | None,
    *,
    mode: str,
    weight_bits: int,
    act_bits: int | None,
    group: int,
    served: tuple[jax.Array, jax.Array] | None = None,
    name: str = "aqt",
) -> jax.Array:
    """`x @ w` through `AqtDotGeneral`, called inside a Flax module's compact method.

    K must be a multiple of `group` (callers zero-pad). In "train" and "convert" mode `w` is
    the float weight (convert also freezes `{value [K/group, group, M], scale [K/group, 1, M]}`
    under `COLLECTION`); in "serve" mode `served = (q [K/group, group, M] ints, scale
    [K/group, M])` replaces it and `w` is unused.
    """
    K = x_NK.shape[1]
    common = dict(
        cfg=_config(weight_bits, act_bits),
        prng_name=None,
        rhs_quant_mode=_MODES[mode],
        rhs_freeze_mode=aqt_flax.FreezerMode.CALIBRATION_AND_VALUE,
        tiling_cfg=_tiling(group),
        name=name,
    )
    if mode == "serve":
        q, scale = served
        qt = aqt_tensor.QTensor(
            qvalue=q.astype(qvalue_dtype(weight_bits)),
            scale=None,
            scale_t=[scale[:, None, :]],
            bias=[],
            dequant_dtype=x_NK.dtype,
        )
        dg = aqt_flax.AqtDotGeneral(**common, rhs_apply_quant_mode=False, rhs_qtensor=qt)
        w_KM = jnp.zeros((K, scale.shape[1]), x_NK.dtype)  # shape only; XLA drops it
    else:
        dg = aqt_flax.AqtDotGeneral(**common)
    return dg(x_NK, w_KM, (((1,), (0,)), ((), ())), None)


def frozen(aqt_vars: Any) -> dict[tuple[str, ...], tuple[jax.Array, jax.Array]]:
    """What CONVERT froze: owner module path -> (q [G, group, M], scale [G, M])."""
    out = {}
    flat = jax.tree_util.tree_flatten_with_path(aqt_vars)[0]
    found: dict[tuple[str, ...], dict[str, jax.Array]] = {}
    for path, leaf in flat:
        keys = tuple(str(p.key) for p in path)
        *owner, dg_name, side, leaf_name = keys
        if side == "qrhs":
            found.setdefault((*owner, dg_name), {})[leaf_name] = leaf
    for (*owner, _), v in found.items():
        out[tuple(owner)] = (v["value"], v["scale"][:, 0, :])
    return out


def fake_quant_table(w_GgM: jax.Array, bits: int) -> tuple[jax.Array, jax.Array]:
    """Quantize `w [G, group, M]` per (G, M) as the dot_general does its weights: (q, scale)."""
    quantizer = aqt_quantizer.quantizer_make(bits, preserve_max_val=True, scale_dtype=SCALE_DTYPE)
    qt, _ = quantizer.quant(w_GgM, calibration_axes=[1])
    return qt.qvalue, qt.scale[0][:, 0, :]
