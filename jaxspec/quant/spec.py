"""What a quantized model is: its scheme, method, group size and storage (`QuantSpec`).

A `QuantSpec` is static (hashable, part of every jit key): the layers (`jaxspec.quant.layers`)
read it to declare and run their params, the pipeline (`jaxspec.quant.quantize`) builds it
from `quantize`'s arguments, and a checkpoint (`jaxspec.quant.checkpoints`) stores it in its
`quantization_config`. The storage it describes is in `jaxspec.quant.quantize`'s doc.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxspec import kernels
from jaxspec.kernels.int4_layout import TILE, pack_int4, pack_tiles
from jaxspec.quant import aqt_compat
from jaxspec.quant import methods as quant_methods

SCHEMES: dict[str, tuple[int, int | None] | None] = {
    "none": None,
    "w8a16": (8, None),
    "w4a16": (4, None),
    "w4a4": (4, 4),
}
SCALE_DTYPE = aqt_compat.SCALE_DTYPE
STORE_DTYPE = jnp.bfloat16  # everything that is not quantized
METHODS = ("gptq", "clip", "asym", "rtn")  # `quantize(method=...)`; quant_methods says how
HEAD_METHODS = quant_methods.SYMMETRIC  # `quantize(head_method=...)`: "absmax" (GGUF's Q8_0)
DEFAULT_METHOD = "gptq"  # the best measured on SmolLM2 (docs/quantization.md)
# rows (tokens) up to which a served matmul uses its kernel, prefill included: a 44-token
# W4A16 prompt on the kernel takes 0.24 s against XLA's 0.74 s
KERNEL_MAX_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """Static description of a quantized model (hashable: it is part of the jit key).

    `method` "rtn" is symmetric absmax through AQT's own calibration (bfloat16 scale);
    "absmax" is GGUF's Q8_0 rule (`methods.quantize_absmax`: symmetric, float16 scale,
    no minimum; only as `head_method`); the others (`jaxspec.quant.methods.METHODS`) are
    asymmetric and store a float16 `minimum` beside the float16 `scale`. `head_bits` and
    `head_method` (None: as the rest) quantize the token embedding / lm_head at other bits
    and by another method; `bits` overrides the scheme's weight bits (set on the head's own
    spec)."""

    scheme: str
    group_size: int | None = None
    embeddings: bool = True
    packed: bool = True
    method: str = "rtn"
    head_bits: int | None = None
    bits: int | None = None
    layout: str = "tiles"  # packed int4: "tiles" (pack_tiles), or "rows" (pack_int4, read only)
    kernel: bool = True  # the int4 kernel where it applies (False: XLA's path, for comparison)
    head_method: str | None = None

    @property
    def weight_bits(self) -> int:
        return self.bits or SCHEMES[self.scheme][0]

    @property
    def asymmetric(self) -> bool:
        return self.method not in ("rtn", *quant_methods.SYMMETRIC)

    @property
    def scale_dtype(self) -> Any:
        return SCALE_DTYPE if self.method == "rtn" else jnp.float16

    def head(self) -> QuantSpec:
        """The spec of the token embedding and lm_head."""
        if self.head_bits is None and self.head_method is None:
            return self
        return dataclasses.replace(
            self, bits=self.head_bits or self.bits, head_bits=None,
            method=self.head_method or self.method, head_method=None,
        )  # fmt: skip

    @property
    def act_bits(self) -> int | None:
        return SCHEMES[self.scheme][1]

    def groups(self, K: int) -> tuple[int, int]:
        """(group size, number of groups) of a contraction axis of size K."""
        g = K if self.group_size is None or self.group_size >= K else self.group_size
        return g, -(-K // g)

    @property
    def tiled(self) -> bool:
        return self.weight_bits == 4 and self.packed and self.layout == "tiles"

    def stored(self, K: int, M: int) -> tuple[tuple[int, ...], Any]:
        """Shape and dtype of the stored ints of a `[K, M]` weight."""
        if self.tiled:
            return (-(-M // TILE), K, 32), jnp.uint8
        if self.weight_bits == 4 and self.packed:
            return (-(-K // 2), M), jnp.uint8
        return (K, M), aqt_compat.qvalue_dtype(self.weight_bits)

    def pack(self, q_KM: jax.Array) -> jax.Array:
        """int8 q `[K, M]` -> the stored ints."""
        if self.tiled:
            return pack_tiles(q_KM)
        if self.weight_bits == 4 and self.packed:
            return pack_int4(q_KM)
        return q_KM.astype(self.stored(*q_KM.shape)[1])

    @property
    def int8_symmetric(self) -> bool:
        """Stored as int8 [K, M] with a scale per group and no minimum (W = scale * q): what
        the int8 kernel reads (a head of `head_method="absmax"`, GGUF's Q8_0)."""
        return self.weight_bits == 8 and not self.asymmetric

    def use_kernel(self, rows: int) -> bool:
        """Whether a served matmul of `rows` rows runs on a kernel (decided at trace): the int4
        one for tiled int4, the int8 one for symmetric int8."""
        return (
            self.kernel and (self.tiled or self.int8_symmetric) and self.act_bits is None
            and rows <= KERNEL_MAX_ROWS and kernels.available()
            and jax.default_backend() == "cpu"
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("kernel", "layout")}
        return out | {"int4_layout": self.layout}  # "layout" is the file's pointer to the doc
