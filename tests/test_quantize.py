"""W8A16 / W4A16 / W4A4 quantization: SERVE == TRAIN == a plain-JAX oracle, real int4
storage, checkpoints, and quantized drafts in speculative decoding."""

from __future__ import annotations

import dataclasses
import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxspec
from jaxspec.ckpts.checkpoint import BUILTIN_DIR
from jaxspec.ckpts.tiny import byte_tokenizer, tiny_config, to_dtype
from jaxspec.compilation.traces import traces
from jaxspec.kernels.int4_layout import (
    pack_int4,
    pack_tiles,
    take_tile_columns,
    unpack_int4,
    unpack_tiles,
)
from jaxspec.nn.config import LlamaConfig
from jaxspec.quant.layers import quant_spec, with_kernel
from jaxspec.quant.quantize import dequantize

# intermediate 72 and hidden 32: group 16 divides one and not the other (zero-padded groups).
VARIANTS = {
    "tied": tiny_config(tie_word_embeddings=True, intermediate_size=72),
    "untied_bias": tiny_config(intermediate_size=72, qkv_bias=True, o_bias=True, mlp_bias=True),
}
CASES = [  # (variant, scheme, group_size)
    ("tied", "w4a16", None),
    ("tied", "w4a16", 16),
    ("tied", "w8a16", 16),
    ("untied_bias", "w4a16", 7),
    ("untied_bias", "w4a4", 16),
]
IDS = np.random.RandomState(0).randint(0, 64, (2, 6))
POS = np.broadcast_to(np.arange(6), IDS.shape)


def _spread(model, scale=3.0):
    """Larger random weights: logits far from ties and from uniform."""
    return model.with_params(jax.tree.map(lambda a: a * scale, model.params))


@pytest.fixture(scope="module")
def models():
    return {
        k: _spread(jaxspec.Model(config=c, params=jaxspec.init_params(c, i)))
        for i, (k, c) in enumerate(VARIANTS.items())
    }


@pytest.fixture(scope="module")
def quantized(models):
    """(variant, scheme, group, packed, mode) -> model, built once per module."""
    cache = {}

    def get(variant, scheme, group, packed=True, mode="serve"):
        key = (variant, scheme, group, packed, mode)
        if key not in cache:
            cache[key] = jaxspec.quantize(
                models[variant], scheme, group, method="rtn", packed=packed, mode=mode
            )
        return cache[key]

    return get


def logits(model, ids=IDS):
    out, _ = model(ids, np.broadcast_to(np.arange(ids.shape[1]), ids.shape), model.init_cache(2, 8))
    return np.asarray(out)


# ----------------------------------------------------------------------------- the oracle


def oracle_dequant(w_KM, bits, group):
    """Symmetric absmax numerics by hand: scale = bf16(absmax / (2^(b-1) - 1)) per (group of
    K, column); q = round-half-even(clip(w * bf16(1/scale), +-(2^(b-1) - 1)))."""
    K, M = w_KM.shape
    g = K if group is None or group >= K else group
    G = -(-K // g)
    w = jnp.pad(jnp.asarray(w_KM, jnp.float32), ((0, G * g - K), (0, 0))).reshape(G, g, M)
    bound = 2.0 ** (bits - 1) - 1
    amax = jnp.max(jnp.abs(w), axis=1, keepdims=True)
    scale = (jnp.where(amax == 0, 1.0, amax) / bound).astype(jnp.bfloat16).astype(jnp.float32)
    inv = (1.0 / scale).astype(jnp.bfloat16).astype(jnp.float32)
    q = jnp.round(jnp.clip(w * inv, -bound, bound))
    return (q * scale).reshape(G * g, M)[:K]


def oracle_model(model, bits, group):
    """The float model with every weight replaced by its dequantized value (rest in bf16)."""

    def leaf(path, a):
        name = path[-1].key
        if name == "kernel":
            return oracle_dequant(a, bits, group)
        if name == "embedding":
            return oracle_dequant(a.T, bits, group).T
        return a.astype(jnp.bfloat16).astype(jnp.float32)

    return model.with_params(jax.tree_util.tree_map_with_path(leaf, model.params))


@pytest.mark.parametrize(("variant", "scheme", "group"), CASES)
def test_serve_equals_fake_quant_train_and_the_oracle(models, quantized, variant, scheme, group):
    served = quantized(variant, scheme, group)
    train = quantized(variant, scheme, group, mode="train")
    assert "kernel" not in str(jax.tree_util.tree_structure(served.params))  # no float weights
    got = logits(served)
    np.testing.assert_allclose(got, logits(train), atol=2e-5, rtol=0)
    err_float = np.abs(got - logits(models[variant])).max()
    assert err_float > 1e-3  # quantization really happened
    if scheme != "w4a4":  # the oracle dequantizes weights only
        bits = 8 if scheme == "w8a16" else 4
        ref = logits(oracle_model(models[variant], bits, group))
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


def test_error_grows_as_bits_shrink(models, quantized):
    def err(variant, scheme, group):
        return np.abs(logits(quantized(variant, scheme, group)) - logits(models[variant])).mean()

    assert err("tied", "w8a16", 16) < err("tied", "w4a16", 16) / 4
    assert err("untied_bias", "w4a16", 16) < err("untied_bias", "w4a4", 16)


# ----------------------------------------------------------------------------- int4 storage


@settings(max_examples=30)
@given(
    st.integers(1, 9).flatmap(
        lambda k: st.integers(1, 4).flatmap(
            lambda m: st.lists(st.integers(-8, 7), min_size=k * m, max_size=k * m).map(
                lambda v: np.asarray(v, np.int8).reshape(k, m)
            )
        )
    )
)
def test_pack_unpack_round_trip(q):
    packed = pack_int4(q)
    assert packed.dtype == jnp.uint8
    assert packed.shape == (-(-q.shape[0] // 2), q.shape[1])
    np.testing.assert_array_equal(np.asarray(unpack_int4(packed, q.shape[0])), q)


def test_packing_layout_is_documented_nibbles():
    q = np.array([[1], [-1], [-8], [7], [3]], np.int8)  # K = 5 -> rows i and i + 3
    assert np.asarray(pack_int4(q))[:, 0].tolist() == [0x71, 0x3F, 0x08]


def test_packed_and_unpacked_int4_give_identical_matmuls(quantized):
    """Packed int4 is stored tiled (`pack_tiles`, what the int4 kernel reads); through XLA's
    path it gives the unpacked model's logits bit for bit, through the kernel (where built)
    the same to float rounding."""
    packed = quantized("tied", "w4a16", 16)
    unpacked = quantized("tied", "w4a16", 16, packed=False)
    np.testing.assert_array_equal(logits(with_kernel(packed, False)), logits(unpacked))
    np.testing.assert_allclose(logits(packed), logits(unpacked), atol=2e-5, rtol=0)
    p = packed.params["layers_0"]["mlp"]["down_proj"]["qweight"]
    u = unpacked.params["layers_0"]["mlp"]["down_proj"]["qweight"]
    assert p.dtype == jnp.uint8 and u.dtype == jnp.int4
    np.testing.assert_array_equal(np.asarray(unpack_tiles(p, 32)), np.asarray(u, np.int8))
    assert p.shape == (1, 72, 32)  # one tile of 64 columns (32 used), 32 bytes per row


def test_the_tiled_layout_is_the_kernels():
    q = np.random.RandomState(3).randint(-8, 8, (37, 150)).astype(np.int8)
    tiles = np.asarray(pack_tiles(jnp.asarray(q)))  # under jax, as a model stores it
    rows = np.asarray(pack_int4(jnp.asarray(q)))  # the checkpoint rows, re-laid in numpy
    np.testing.assert_array_equal(tiles, pack_tiles(unpack_int4(rows, 37)))
    np.testing.assert_array_equal(np.asarray(unpack_tiles(tiles, 150)), q)
    cols = jnp.asarray([0, 63, 64, 149, 5])
    np.testing.assert_array_equal(np.asarray(take_tile_columns(tiles, cols)), q[:, cols])


def test_resident_bytes_of_w4a16_are_under_0_3x_bf16():
    """A model where the weights, not the norms, dominate: the shipped default target's shapes
    (hidden 256, tied), with 2 layers and a 512-token vocabulary."""
    shipped = json.loads((BUILTIN_DIR / "target" / "config.json").read_text())
    cfg = dataclasses.replace(LlamaConfig.from_hf(shipped), vocab_size=512, num_hidden_layers=2)
    model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 0))
    bf16 = to_dtype(model, jnp.bfloat16).nbytes()
    assert bf16 == 2 * cfg.num_params
    ratios = {}
    for group in (None, 128, 32):
        q = jaxspec.quantize(model, "w4a16", group, method="rtn")
        ratios[f"w4a16 g{group}"] = q.nbytes() / bf16
    ratios["w4a16 g128 embeddings bf16"] = (
        jaxspec.quantize(model, "w4a16", 128, method="rtn", embeddings=False).nbytes() / bf16
    )
    # asymmetric: a float16 minimum beside each scale (method "asym": no calibration needed)
    ratios["w4a16 g128 asym"] = jaxspec.quantize(model, "w4a16", 128, method="asym").nbytes()
    ratios["w4a16 g128 asym"] /= bf16
    assert ratios["w4a16 g128"] < ratios["w4a16 g128 asym"] <= 0.30
    print("resident bytes / bf16:", {k: round(v, 4) for k, v in ratios.items()})
    for group in (None, 128, 32):
        assert ratios[f"w4a16 g{group}"] <= 0.30
    assert ratios["w4a16 gNone"] < ratios["w4a16 g128"] < ratios["w4a16 g32"]
    assert ratios["w4a16 g128 embeddings bf16"] > 0.30


# ----------------------------------------------------------------------------- use as a model


def test_save_and_load_give_identical_logits(tmp_path, models, quantized, monkeypatch):
    q = quantized("untied_bias", "w4a16", 7)
    q = q.with_params(q.params, tokenizer=byte_tokenizer())
    jaxspec.save(q, tmp_path / "q")
    qmod = importlib.import_module("jaxspec.quant.quantize")  # the attribute is the function
    monkeypatch.setattr(qmod, "_convert", lambda *a: pytest.fail("re-quantized"))
    loaded = jaxspec.load(tmp_path / "q")
    assert quant_spec(loaded) == quant_spec(q)
    assert loaded.nbytes() == q.nbytes()
    assert loaded.tokenizer is not None
    np.testing.assert_array_equal(logits(loaded), logits(q))
    with pytest.raises(ValueError, match="dtype"):
        jaxspec.save(q, tmp_path / "x", dtype=jnp.bfloat16)


def test_a_missing_tensor_is_named(tmp_path, quantized):
    from safetensors.flax import load_file, save_file

    d = jaxspec.save(quantized("tied", "w8a16", 16), tmp_path / "q")
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["layers_1.mlp.up_proj.scale"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(jaxspec.CheckpointError, match=r"layers_1\.mlp\.up_proj\.scale"):
        jaxspec.load(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["format_version"] = 99
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(jaxspec.CheckpointError, match="format"):
        jaxspec.load(d)


def test_quantized_drafts_are_lossless_and_self_speculation_accepts_more(models, quantized):
    target = models["tied"]
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    plain = jaxspec.generate(target, prompts, 12, temperature=0)
    self_draft = quantized("tied", "w4a16", 16)
    # Another model of the same architecture: the same module, one compilation for both.
    other = jaxspec.Model(config=target.config, params=jaxspec.init_params(target.config, 5))
    other_draft = jaxspec.quantize(_spread(other), "w4a16", 16, method="rtn")
    assert other_draft.module == self_draft.module
    alphas = {}
    for name, draft in (("self", self_draft), ("other", other_draft)):
        out = jaxspec.generate(target, prompts, 12, temperature=0, draft=draft, gamma=4)
        assert out.tokens == plain.tokens
        alphas[name] = out.stats.figures.acceptance_rate
    assert alphas["self"] > alphas["other"], alphas


def test_the_same_spec_shares_compilations(models):
    a = jaxspec.quantize(models["tied"], "w4a16", 16, method="rtn")
    b = jaxspec.quantize(models["tied"], "w4a16", 16, method="rtn")
    assert a.module == b.module and hash(a.module) == hash(b.module)
    logits(a)
    with traces() as traced:
        logits(b)
    assert traced == []


def test_arguments_are_checked(models, quantized):
    m = models["tied"]
    assert jaxspec.quantize(m, "none") is m
    with pytest.raises(ValueError, match="unknown scheme"):
        jaxspec.quantize(m, "w3a16")
    with pytest.raises(ValueError, match="group_size"):
        jaxspec.quantize(m, "w4a16", 0)
    with pytest.raises(ValueError, match="already quantized"):
        jaxspec.quantize(quantized("tied", "w4a16", 16), "w4a16")
    with pytest.raises(ValueError, match="float32/bfloat16"):
        jaxspec.quantize(m.with_params(m.params, dtype=jnp.float64), "w4a16")


@pytest.mark.parametrize(("variant", "group"), [("tied", 16), ("untied_bias", 7)])
def test_dequantize_gives_the_oracle_weights_and_the_served_logits(
    models, quantized, variant, group
):
    q = quantized(variant, "w4a16", group)
    f = dequantize(q)
    assert quant_spec(f) is None
    want = oracle_model(models[variant], 4, group)
    got_leaves = jax.tree_util.tree_leaves_with_path(f.params)
    want_flat = dict(jax.tree_util.tree_leaves_with_path(want.params))
    assert {p for p, _ in got_leaves} == set(want_flat)
    for path, leaf in got_leaves:
        assert leaf.dtype == jnp.float32
        np.testing.assert_allclose(leaf, want_flat[path], rtol=1e-6, atol=1e-7, err_msg=str(path))
    np.testing.assert_allclose(logits(f), logits(q), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="quantized"):
        dequantize(models[variant])
