"""Quantized checkpoints: `save_quantized` writes a served quantized model (its ints and
scales under their Flax paths, its `QuantSpec` in config.json's `quantization_config`) and
`load_quantized` reads it back without re-quantizing. `jaxspec.save` and `jaxspec.load` call
these for quantized models.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from jaxspec.kernels.int4_layout import pack_tiles, unpack_int4
from jaxspec.nn.config import CheckpointError
from jaxspec.nn.model import Model
from jaxspec.quant.layers import initial_params, quant_llama, quant_spec, shape_and_int_dtype
from jaxspec.quant.spec import HEAD_METHODS, METHODS, QuantSpec

QUANT_METHOD = "jaxspec-aqt"
FORMAT_VERSION = 1


def _flatten(params: Any) -> dict[str, jax.Array]:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {".".join(str(p.key) for p in path): leaf for path, leaf in flat}


def save_quantized(model: Model, path: Any) -> pathlib.Path:
    """Write a quantized model: config.json (with `quantization_config`), model.safetensors
    (the served params under their Flax paths, e.g. `layers_0.mlp.up_proj.qweight`) and the
    tokenizer. `jaxspec.save` calls this for quantized models, `jaxspec.load` reads it back.
    """
    from safetensors.flax import save_file

    spec = quant_spec(model)
    if spec is None:
        raise ValueError("save_quantized wants a quantized model (see jaxspec.quantize)")
    if model.dense_cls.mode != "serve":
        raise ValueError("only served (mode='serve') models are saved; quantize() again")
    d = pathlib.Path(path)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, leaf in _flatten(model.params).items():
        arr = jnp.asarray(leaf)
        tensors[name] = arr.astype(jnp.int8) if arr.dtype == jnp.int4 else arr  # no int4 in st
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "jaxspec"})
    cfg = model.config.to_hf()
    cfg["dtype"] = jnp.dtype(model.dtype).name
    cfg["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "format_version": FORMAT_VERSION,
        **spec.to_json(),
        "scale_dtype": jnp.dtype(spec.scale_dtype).name,
        "layout": "see jaxspec/quant/quantize.py",
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(d))
    return d


def load_quantized(
    d: pathlib.Path,
    raw_cfg: dict[str, Any],
    *,
    dtype: Any = jnp.float32,
    tokenizer: Any = None,
    name: str = "",
) -> Model:
    """Read a directory written by `save_quantized` (no re-quantization)."""
    from safetensors import safe_open

    from jaxspec.nn.config import LlamaConfig

    q = raw_cfg["quantization_config"]
    if q.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{d}: unsupported {QUANT_METHOD} format {q.get('format_version')}")
    try:
        spec = QuantSpec(
            q["scheme"], q["group_size"], bool(q["embeddings"]), bool(q["packed"]),
            q.get("method", "rtn"), q.get("head_bits"), q.get("bits"),
            q.get("int4_layout", "rows"),  # files from before the tiled layout
            head_method=q.get("head_method"),  # files from before it: as the body
        )  # fmt: skip
        if spec.layout not in ("rows", "tiles"):
            raise KeyError(f"layout {spec.layout!r}")
        spec.weight_bits  # noqa: B018 (validates the scheme)
        if spec.method not in METHODS:
            raise KeyError(f"method {spec.method!r}")
        if spec.head_method not in (None, *HEAD_METHODS):
            raise KeyError(f"head_method {spec.head_method!r}")
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{d}: bad quantization_config {q}: {e}") from None
    config = LlamaConfig.from_hf(raw_cfg)
    shell = Model(config=config, params=None, dtype=dtype)
    module = quant_llama(shell, spec, "serve")
    shapes = jax.eval_shape(lambda: initial_params(module, config))  # traced once: seconds via AQT
    expected = _flatten(shapes)
    f = d / "model.safetensors"
    if not f.is_file():
        raise CheckpointError(f"{d} has no model.safetensors")
    flat = {}
    with safe_open(str(f), framework="flax") as st:
        names = set(st.keys())
        for key, leaf in expected.items():
            if key not in names:
                raise CheckpointError(f"{d}: tensor {key!r} is missing")
            arr = st.get_tensor(key)
            if tuple(arr.shape) != tuple(leaf.shape):
                raise CheckpointError(
                    f"{d}: tensor {key!r} has shape {tuple(arr.shape)}, expected {leaf.shape}"
                )
            if shape_and_int_dtype(arr) != shape_and_int_dtype(leaf) and leaf.dtype != jnp.int4:
                raise CheckpointError(
                    f"{d}: tensor {key!r} has dtype {arr.dtype}, not {leaf.dtype}"
                )
            flat[key] = jnp.asarray(arr, leaf.dtype if leaf.dtype == jnp.int4 else arr.dtype)
        extra = sorted(names - set(expected))
        if extra:
            raise CheckpointError(f"{d}: unexpected tensors {extra[:5]}")
    if spec.weight_bits == 4 and spec.packed and spec.layout == "rows":
        spec = dataclasses.replace(spec, layout="tiles")  # what the int4 kernel reads
        module = quant_llama(shell, spec, "serve")
        shapes = jax.eval_shape(lambda: initial_params(module, config))
        flat = _rows_to_tiles(flat, _flatten(shapes))
    treedef = jax.tree.structure(shapes)
    params = jax.tree.unflatten(treedef, [flat[k] for k in expected])
    return Model(
        config=config,
        params=params,
        tokenizer=tokenizer,
        dtype=dtype,
        name=name,
        dense_cls=module.dense_cls,
        embed_cls=module.embed_cls,
    )


def _rows_to_tiles(flat: dict[str, Any], tiled: dict[str, Any]) -> dict[str, Any]:
    """Packed int4 weights of the "rows" layout (`pack_int4`) in the "tiles" one (`pack_tiles`):
    the same ints, re-laid once at load (`jaxspec.kernels.int4_layout`)."""
    out = dict(flat)
    for key, want in tiled.items():
        have = flat[key]
        if key.endswith("qweight") and tuple(have.shape) != tuple(want.shape):
            K = want.shape[1]
            out[key] = pack_tiles(unpack_int4(have, K))
    return out
