"""Weight quantization of a `Model` (W8A16, W4A16, W4A4) on AQT, with real 4-bit storage.

`quantize(model, "w4a16", group_size=128)` runs AQT's TRAIN -> CONVERT -> SERVE flow:

    TRAIN    float kernels, every matmul fake-quantized by `AqtDotGeneral` (`mode="train"`)
    CONVERT  one forward freezes each weight's ints and scales (AQT's "aqt" collection)
    SERVE    the served model holds only the frozen ints (int4 packed two per byte) and
             scales; each jitted matmul unpacks and hands them to `AqtDotGeneral` (SERVE)

What is quantized: every linear layer (q/k/v/o, gate/up/down) and, by default
(`embeddings=True`), the token embedding and the lm_head too — one table when they are
tied, as in the shipped default pair, where the 4096-token embedding is 59 % of the draft's
weights: with it in bf16 the w4a16 draft keeps 0.70x of its bf16 bytes, quantized 0.26x, for
+0.6% against +1.4% held-out perplexity (tools/quality_w4a16.py). Attention scores, RMSNorm and the
softmax stay in float; norm scales, biases (and the embedding with `embeddings=False`) are
stored in bfloat16. Activations run in `model.dtype`, unquantized except under "w4a4".

Scales of method "rtn": symmetric absmax (a group's largest |w| maps to 2^(b-1) - 1 exactly;
`aqt_compat` says why that is not AQT's default), one bfloat16 scale per output column and per
group of `group_size` consecutive inputs (the contraction axis); `group_size=None` is
per-channel (one group). A contraction axis that `group_size` does not divide is zero-padded
to whole groups inside the matmul; only the real rows are stored. The other methods
(`jaxspec.quant.methods`) store float16 scales of the same shape, plus a float16 `minimum` of
that shape for the asymmetric ones; a head of `head_method="absmax"` (GGUF's Q8_0 at 8 bits)
has `qweight` and `scale` only: w = scale * q.

Storage of a `[K, M]` weight (`qweight`, `scale`, plus `bias` when the layer has one):

    int4, packed   qweight uint8 [ceil(M/64), K, 32]: the int4 kernel's tiles
                   (`jaxspec.kernels.int4_layout.pack_tiles`; files of the older rows
                   layout, `pack_int4`, are re-laid at load)
    int4, unpacked qweight int4 [K, M]  (`packed=False`: XLA on CPU spends a byte on each)
    int8           qweight int8 [K, M]
    scales         scale bfloat16 [ceil(K/group), M]  (float16 for the numpy methods)
    minimum        minimum float16 [ceil(K/group), M]  (asymmetric methods only)

The embedding is stored transposed, `[hidden, vocab]`, as the weight of `attend`; a lookup
gathers the columns of its tokens and unpacks only those.

Modules: `spec` (QuantSpec, the schemes and methods), `layers` (QuantDense, QuantEmbed and
their factories), this one (the pipeline: `quantize`, `dequantize`), `checkpoints` (save and
load without re-quantizing), `methods` and `calibration` (the numpy methods and GPTQ's data).
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.nn.model import Llama, Model, init_cache
from jaxspec.quant import aqt_compat
from jaxspec.quant import methods as quant_methods
from jaxspec.quant.layers import (
    initial_params,
    quant_llama,
    quant_spec,
    shape_and_int_dtype,
    stored_ints,
)
from jaxspec.quant.spec import (
    DEFAULT_METHOD,
    HEAD_METHODS,
    METHODS,
    SCALE_DTYPE,
    SCHEMES,
    STORE_DTYPE,
    QuantSpec,
)


def _quantized_leaf(spec: QuantSpec, keys: tuple[str, ...]) -> bool:
    """Whether a float param is quantized (else it is stored in bfloat16)."""
    if keys[-1] == "embedding":
        return spec.embeddings
    if keys[-1] == "kernel":
        return spec.embeddings or keys[0] != "lm_head"
    return False


def quantize(
    model: Model,
    scheme: str,
    group_size: int | None = None,
    *,
    method: str | None = None,
    head_bits: int | None = None,
    head_method: str | None = None,
    calibration: Sequence[Sequence[int]] | None = None,
    embeddings: bool = True,
    packed: bool = True,
    mode: str = "serve",
    progress: Callable[[str, int, int], None] | None = None,
) -> Model:
    """The model with quantized weights (see the module doc).

    Args:
      model: a float `Model` (float32 or bfloat16 activations).
      scheme: "none" (the model itself), "w8a16", "w4a16" or "w4a4".
      group_size: inputs per scale along the contraction axis (e.g. 128 or 32); None is
        one scale per output channel.
      method: how weights become ints: "gptq" (the default for w4a16/w8a16: the best
        measured, docs/quantization.md), "clip", "asym" (`jaxspec.quant.methods`) or "rtn"
        (symmetric absmax, AQT's calibration; the only one for w4a4 and mode="train").
      head_bits: bits of the token embedding / lm_head (e.g. 8); None: as the other layers.
      head_method: how the token embedding / lm_head become ints; None: as the other layers
        (GPTQ's head has a Hessian of its own), "absmax": GGUF's Q8_0 rule (symmetric, one
        float16 scale per group, round half away from zero, no calibration), which gives a
        table that was Q8_0 at `group_size` back bit for bit. Not with method "rtn".
      calibration: token sequences whose activations GPTQ's Hessians are taken on; None
        builds them (`jaxspec.quant.calibration`: chat prompts from CPython's own documentation
        and the model's answers to them). Ignored by the other methods.
      embeddings: also quantize the token embedding and lm_head (else they stay bfloat16).
      packed: store int4 two per byte (False: one int4 per byte, for comparison).
      mode: "serve" (frozen ints, no float kernels) or "train" (float kernels, AQT
        fake-quantization at every call: the reference the served "rtn" model must match).
      progress: called as progress(stage, done, total) ("answers", "hessians", "weights"
        for GPTQ without `calibration`; the others have "weights" only), each stage first with
        done = 0 as it begins, then as its parts finish (weights one by one).

    Returns:
      A `Model` usable wherever a model is (`generate` as target or draft, `save`, ...);
      `nbytes()` is its resident size.
    """
    method = _check_quantize(model, scheme, group_size, method, head_bits, mode)
    _check_head_method(method, head_method, embeddings)
    if scheme == "none":
        return model
    if head_bits == SCHEMES[scheme][0]:
        head_bits = None
    spec = QuantSpec(scheme, group_size, embeddings, packed, method, head_bits,
                     head_method=head_method)  # fmt: skip

    def keep_or_store(path: Any, leaf: jax.Array) -> jax.Array:
        keys = tuple(str(p.key) for p in path)
        return leaf if _quantized_leaf(spec, keys) else leaf.astype(STORE_DTYPE)

    float_params = jax.tree_util.tree_map_with_path(keep_or_store, model.params)
    suffix = f"{scheme}" + ("" if group_size is None else f"-g{group_size}")
    suffix += "" if method == "rtn" else f"-{method}"
    suffix += "" if head_bits is None else f"-head{head_bits}"
    suffix += "" if head_method is None else f"-head-{head_method}"
    if mode == "train":
        m = quant_llama(model, spec, "train")
        name = f"{model.name}:{suffix}:train"
        return model.with_params(
            float_params, dense_cls=m.dense_cls, embed_cls=m.embed_cls, name=name
        )
    served = _quantized_params(model, spec, float_params, calibration, progress)
    m = quant_llama(model, spec, "serve")
    return model.with_params(
        served, dense_cls=m.dense_cls, embed_cls=m.embed_cls, name=f"{model.name}:{suffix}"
    )


def _check_quantize(
    model: Model,
    scheme: str,
    group_size: int | None,
    method: str | None,
    head_bits: int | None,
    mode: str,
) -> str:
    """`quantize`'s arguments checked (ValueError naming the bad one); returns the method."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {sorted(SCHEMES)}")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be a positive int or None, got {group_size!r}")
    if mode not in ("serve", "train"):
        raise ValueError(f"mode must be 'serve' or 'train', got {mode!r}")
    if model.dense_cls is not None or model.embed_cls is not None:
        raise ValueError(
            f"model {model.name!r} is already quantized: use it as it is (a quantized model "
            "drafts and serves without quantize(); `jaxspec.load('smollm2-draft')` and "
            "`jaxspec.load('smollm2-w4a16')` are ready-made W4A16 drafts), or quantize a float "
            "checkpoint, e.g. `jaxspec.quantize(jaxspec.load('smollm2'), 'w4a16', group_size=32)`"
        )
    if model.dot_general_cls is not None:
        raise ValueError("quantize() needs a model without a custom dot_general_cls")
    method = method or ("rtn" if scheme == "w4a4" or mode == "train" else DEFAULT_METHOD)
    if method not in ("rtn", *quant_methods.METHODS):
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if method != "rtn" and (scheme == "w4a4" or mode == "train"):
        raise ValueError(f"method {method!r} is for served w4a16/w8a16; w4a4 and train use rtn")
    if head_bits not in (None, 4, 8):
        raise ValueError(f"head_bits must be 4, 8 or None, got {head_bits!r}")
    if scheme == "none":
        return method
    dtypes = {jnp.dtype(model.dtype)} | {jnp.dtype(a.dtype) for a in jax.tree.leaves(model.params)}
    if not dtypes <= {jnp.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16)}:
        raise ValueError(
            f"AQT quantizes float32/bfloat16/float16 models, got {sorted(map(str, dtypes))}"
        )
    return method


def _check_head_method(method: str, head_method: str | None, embeddings: bool) -> None:
    """`quantize`'s head_method checked against its method (ValueError naming it)."""
    if head_method is None:
        return
    if head_method not in HEAD_METHODS:
        raise ValueError(f"unknown head_method {head_method!r}; choose one of {HEAD_METHODS}")
    if method == "rtn":
        raise ValueError(
            "head_method is for the numpy methods (gptq, clip, asym); 'rtn' is AQT's own "
            "symmetric absmax already (bfloat16 scales): give head_bits alone"
        )
    if not embeddings:
        raise ValueError("head_method with embeddings=False: the head is not quantized")


def _quantized_params(
    model: Model,
    spec: QuantSpec,
    float_params: Any,
    calibration: Sequence[Sequence[int]] | None,
    progress: Callable[[str, int, int], None] | None,
) -> Any:
    """The SERVE module's params (ints and scales) of `spec.method`, checked against the
    shapes and int dtypes the module expects."""
    if spec.method == "rtn":
        served = _convert(quant_llama(model, spec, "convert"), spec, float_params)
    else:
        hessians = {}
        if spec.method == "gptq":
            hessians = _calibration_hessians(model, calibration, progress)
        served = _quantize_asym(spec, float_params, hessians, progress)
    m = quant_llama(model, spec, "serve")
    shapes = jax.eval_shape(lambda: initial_params(m, model.config))
    expected = jax.tree.map(shape_and_int_dtype, shapes)
    if expected != jax.tree.map(shape_and_int_dtype, served):
        raise AssertionError("the served params do not match the SERVE module")
    return served


def _calibration_hessians(
    model: Model, calibration: Sequence[Sequence[int]] | None, progress: Any
) -> dict[tuple[str, ...], Any]:
    """GPTQ's Hessians on `calibration`, or on the default answers; while those are generated,
    a second thread compiles the Hessians' probe (compilation is one core's work)."""
    from jaxspec.quant import calibration as calib

    if calibration:
        return calib.hessians(model, calibration, progress=progress)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="probe") as pool:
        probe = pool.submit(calib.compiled_probe, model)
        seqs = calib.default_sequences(model, progress=progress)
        return calib.hessians(model, seqs, progress=progress, probe=probe.result())


def _quantize_asym(
    spec: QuantSpec, float_params: Any, hessians: dict[tuple[str, ...], Any], progress: Any
) -> Any:
    """The served params of an asymmetric method: each quantized float weight replaced by
    {qweight, scale, minimum} (`jaxspec.quant.methods`, in numpy, all weights in one
    `quantize_many` call: shared Hessians once, on every CPU); a head of a symmetric
    `head_method` by {qweight, scale}, from the float table alone (no Hessian)."""
    owners: dict[tuple[str, ...], QuantSpec] = {}
    jobs = []

    def collect(node: Any, path: tuple[str, ...]) -> None:
        if _owns_weight(spec, node, path):
            embed = "embedding" in node
            s = spec.head() if embed or path[0] == "lm_head" else spec
            w = np.asarray(node["embedding"], np.float32).T if embed else np.asarray(node["kernel"])
            owners[path] = s
            h = hessians.get(path) if s.method == spec.method else None
            g = s.groups(w.shape[0])[0]
            jobs.append(quant_methods.Job(w, h, s.weight_bits, g, s.method))
        elif isinstance(node, dict):
            for k, v in node.items():
                collect(v, (*path, k))

    collect(dict(float_params), ())
    report = None if progress is None else (lambda done: progress("weights", done, len(jobs)))
    if report:
        report(0)
    done = dict(zip(owners, quant_methods.quantize_many(jobs, spec.method, report), strict=True))

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if path in done:
            qz, s = done[path], owners[path]
            out = {k: v for k, v in node.items() if k not in ("kernel", "embedding")}
            out |= {"qweight": s.pack(jnp.asarray(qz.q)), "scale": jnp.asarray(qz.scale)}
            return out if qz.minimum is None else out | {"minimum": jnp.asarray(qz.minimum)}
        if isinstance(node, dict):
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        return node

    return walk(dict(float_params), ())


def _owns_weight(spec: QuantSpec, node: Any, path: tuple[str, ...]) -> bool:
    """Whether `node` is a layer whose kernel or embedding `spec` quantizes."""
    return isinstance(node, dict) and (
        (_quantized_leaf(spec, (*path, "kernel")) and "kernel" in node)
        or (_quantized_leaf(spec, (*path, "embedding")) and "embedding" in node)
    )


def dequantize(model: Model, dtype: Any = jnp.float32) -> Model:
    """The float model whose weights are the quantized model's ints times their scales, in
    `dtype`: what a peer without int4 kernels runs (`jaxspec.save` then writes a plain HF
    checkpoint). Its matmuls are float, so logits differ from the quantized model's by the
    activation rounding only.

    Raises:
      ValueError: `model` is not quantized (see `quantize`) or not a served model.
    """
    spec = quant_spec(model)
    if spec is None or model.dense_cls.mode != "serve":
        raise ValueError("dequantize wants a served quantized model (see jaxspec.quantize)")
    float_llama = Llama(model.config, model.dtype)
    float_shapes = jax.eval_shape(lambda: initial_params(float_llama, model.config))

    def weight(node: dict[str, Any], K: int, s: QuantSpec) -> jax.Array:
        M = node["scale"].shape[1]
        q = stored_ints(s, node["qweight"], K, M).astype(jnp.float32)  # [G, g, M]
        scale = node["scale"].astype(jnp.float32)[:, None, :]
        w = q * scale
        if "minimum" in node:
            w = (q + 2 ** (s.weight_bits - 1)) * scale + node["minimum"].astype(jnp.float32)[
                :, None, :
            ]
        return w.reshape(-1, w.shape[-1])[:K]  # [K, M]

    def walk(shapes: Any, node: Any, path: tuple[str, ...] = ()) -> Any:
        if not isinstance(shapes, dict):
            return jnp.asarray(node, dtype)
        out = {}
        head = spec.head() if path[:1] in (("lm_head",), ("embed_tokens",)) else spec
        for k, v in shapes.items():
            if k == "kernel" and "qweight" in node:
                out[k] = weight(node, v.shape[0], head).astype(dtype)
            elif k == "embedding" and "qweight" in node:
                out[k] = weight(node, v.shape[1], head).T.astype(dtype)  # [V, H]
            else:
                out[k] = walk(v, node[k], (*path, k))
        return out

    params = walk(dict(float_shapes), dict(model.params))
    return Model(
        config=model.config,
        params=params,
        tokenizer=model.tokenizer,
        dtype=model.dtype,
        name=f"{model.name}:dequantized",
    )


@functools.partial(jax.jit, static_argnames=("module", "spec"))
def _convert(module: Llama, spec: QuantSpec, params: Any) -> Any:
    """AQT CONVERT (one forward of one token freezes every weight's ints and scales), then
    the served params: each quantized float weight replaced by its stored ints and scales."""
    tok = jnp.zeros((1, 1), jnp.int32)
    cache = init_cache(module.config, 1, 1, module.dtype)
    _, variables = module.apply(
        {"params": params}, tok, tok, tok > -1, cache, mutable=[aqt_compat.COLLECTION]
    )
    frozen = {}
    for owner, qs in aqt_compat.frozen(variables[aqt_compat.COLLECTION]).items():
        assert owner[-1] == "matmul", owner
        frozen[owner[:-1]] = qs
    return _serve_params(spec, params, frozen)


def _serve_params(spec: QuantSpec, float_params: Any, frozen: dict) -> Any:
    """Replace each quantized float weight by its stored ints and scales."""

    def store(q_GgM: jax.Array, K: int, path: tuple[str, ...]) -> jax.Array:
        s = spec.head() if path[0] in ("embed_tokens", "lm_head") else spec
        return s.pack(q_GgM.reshape(-1, q_GgM.shape[-1])[:K].astype(jnp.int8))

    def walk(node: Any, path: tuple[str, ...]) -> Any:
        if path in frozen:
            q, scale = frozen[path]
            out = {k: v for k, v in node.items() if k not in ("kernel", "embedding")}
            K = node["kernel"].shape[0] if "kernel" in node else node["embedding"].shape[1]
            out["qweight"] = store(q, K, path)
            out["scale"] = scale.astype(SCALE_DTYPE)
            return out
        if isinstance(node, dict):
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        return node

    missing = [p for p in frozen if _get(float_params, p) is None]
    if missing:
        raise AssertionError(f"CONVERT froze layers missing from the params: {missing}")
    return walk(dict(float_params), ())


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree
