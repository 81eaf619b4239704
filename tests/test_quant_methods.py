"""The asymmetric quantizers (asym, clip, GPTQ), the int8 head, calibration data, and the
packed copies of a model served through the same AQT int dot path."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.quant import calibration
from jaxspec.quant import methods as quant_methods
from jaxspec.quant.quantize import dequantize, quant_spec

qmod = importlib.import_module("jaxspec.quant.quantize")  # the package attribute is the function
IDS = np.random.RandomState(1).randint(0, 64, (2, 6))


def logits(model, ids=IDS):
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    out, _ = model(ids, pos, model.init_cache(ids.shape[0], 8))
    return np.asarray(out)


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config(tie_word_embeddings=True, intermediate_size=72)
    params = jax.tree.map(lambda a: a * 3.0, jaxspec.init_params(cfg, 3))
    return jaxspec.Model(config=cfg, params=params, name="tiny")  # prompts as bytes


# ----------------------------------------------------------------------------- numpy methods


def _q41(K: int, M: int, group: int, seed: int = 0) -> np.ndarray:
    """A weight that is exactly GGUF Q4_1 at `group`: float16 d and m, q in 0..15, both ends
    used in every block (what ggml's quantizer produces)."""
    rng = np.random.default_rng(seed)
    d = (rng.random((K // group, M)) * 0.01 + 1e-3).astype(np.float16).astype(np.float32)
    m = (rng.standard_normal((K // group, M)) * 0.05).astype(np.float16).astype(np.float32)
    q = rng.integers(0, 16, (K, M))
    q[::group], q[1::group] = 0, 15
    return (q * np.repeat(d, group, 0) + np.repeat(m, group, 0)).astype(np.float32)


@pytest.mark.parametrize("method", quant_methods.METHODS)
def test_a_q4_1_grid_comes_back_exactly(method):
    """SmolLM2's GGUF is Q4_1 at group 32: every method finds that grid again, bit for bit
    (a method storing offset = min + 8 scale in float16 instead of the minimum does not)."""
    w = _q41(96, 40, 32)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((500, 96)) * (1 + 3 * rng.random(96))
    got = quant_methods.quantize_weight(w, method, 4, 32, x.T @ x)
    np.testing.assert_array_equal(got.dequant(32), w)
    assert got.scale.dtype == got.minimum.dtype == np.float16
    assert got.q.min() == -8 and got.q.max() == 7


def _output_error(method: str, mutant: str | None = None) -> float:
    """Mean squared error of x @ w after quantization, x with correlated, uneven features."""
    rng = np.random.default_rng(0)
    K, M = 128, 48
    w = rng.standard_normal((K, M)).astype(np.float32) * 0.05
    mix = rng.standard_normal((K, K)) * 0.3 + np.eye(K) * (1 + 4 * rng.random(K))
    x = rng.standard_normal((2000, K)) @ mix
    h = x.T @ x / len(x)
    if mutant == "no_feedback":  # GPTQ whose error feedback is lost: the clip search alone
        h = np.diag(np.diag(h))
    got = quant_methods.quantize_weight(w, method, 4, 32, h)
    return float(((x @ (w - got.dequant(32))) ** 2).mean())


def test_gptq_beats_the_clipping_search_which_beats_min_max():
    errs = {m: _output_error(m) for m in quant_methods.METHODS}
    assert errs["gptq"] < 0.8 * errs["clip"] < 0.8 * errs["asym"], errs
    # the mutant: without the off-diagonal Hessian, GPTQ has nothing to compensate with
    assert _output_error("gptq", mutant="no_feedback") > 1.1 * errs["gptq"]


def test_int8_groups_are_much_finer_than_int4():
    w = np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32)
    e4 = np.abs(quant_methods.quantize_weight(w, "clip", 4, 32).dequant(32) - w).mean()
    e8 = np.abs(quant_methods.quantize_weight(w, "clip", 8, 32).dequant(32) - w).mean()
    assert e8 < e4 / 10


def _reference_gptq(w_KM, h_KK, bits, group):
    """GPTQ as it was first written (one row's full outer update at a time, the clipping
    search of `group_params`): what the faster `quantize_gptq` / `quantize_many` must equal
    bit for bit, so that a rebuilt W4A16 copy is the same file."""
    K, M = w_KM.shape
    G = -(-K // group)
    W = np.array(w_KM, np.float64)
    W[np.diag(h_KK) == 0] = 0.0
    U = quant_methods._inverse_cholesky(h_KK)
    hdiag = np.diag(h_KK).astype(np.float32)
    q = np.empty((K, M), np.int8)
    scale = np.empty((G, M), np.float16)
    minimum = np.empty((G, M), np.float16)
    for b0 in range(0, K, quant_methods.BLOCK):
        b1 = min(K, b0 + quant_methods.BLOCK)
        Wb, Eb = W[b0:b1].copy(), np.zeros((b1 - b0, M))
        for i in range(b1 - b0):
            k = b0 + i
            if k % group == 0:
                gi, ge = k // group, min(K, k + group)
                rows = Wb[i : i + (ge - k)] if ge <= b1 else np.concatenate([Wb[i:], W[b1:ge]])
                scale[gi], minimum[gi] = quant_methods.group_params(
                    rows.T.astype(np.float32), bits, hdiag[k:ge], clip=True
                )
            gi = k // group
            s, o = scale[gi].astype(np.float32), quant_methods.offset(scale[gi], minimum[gi], bits)
            row = Wb[i].astype(np.float32)
            q[k] = np.clip(np.rint((row - minimum[gi].astype(np.float32)) / s), 0, 15) - 8
            err = (Wb[i] - (q[k] * s + o)) / U[k, k]
            Wb[i:] -= np.outer(U[k, k:b1], err)
            Eb[i] = err
        W[b1:] -= U[b0:b1, b1:].T @ Eb
    return q, scale, minimum


def _hessian(K: int, seed: int, dead: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3 * K, K)) @ (np.eye(K) + 0.3 * rng.standard_normal((K, K)))
    x[:, :dead] = 0.0  # inputs no calibration token reaches
    return x.T @ x / len(x)


def _same(got, want):
    for a, b in zip((got.q, got.scale, got.minimum), want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("K", "M", "group"), [(160, 24, 32), (200, 9, 48), (64, 40, 64)])
def test_gptq_is_the_reference_algorithm_bit_for_bit(K, M, group):
    """Blocks of 128 cut short (K 160, 200), a group across a block's end (48), dead inputs."""
    w = np.random.default_rng(K).standard_normal((K, M)).astype(np.float32) * 0.05
    h = _hessian(K, seed=M, dead=3)
    _same(quant_methods.quantize_gptq(w, h, 4, group), _reference_gptq(w, h, 4, group))


def test_the_clipping_search_in_place_is_group_params():
    rng = np.random.default_rng(5)
    for g, M in ((32, 300), (7, 5)):
        w = rng.standard_normal((g, M)).astype(np.float32)
        w[:, 0] = 0.25  # a flat column
        wk = rng.random(g).astype(np.float32)
        want = quant_methods.group_params(w.T, 4, wk, clip=True)
        for a, b in zip(quant_methods._clip_search(w, 4, wk), want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_quantize_many_is_each_weight_alone(monkeypatch):
    """Weights sharing a Hessian run as one, a wide one in pieces, on two threads; a weight
    without a Hessian is the clipping search; progress counts weights as they finish."""
    monkeypatch.setattr(quant_methods, "PIECE_COLUMNS", 16)
    rng = np.random.default_rng(3)
    h, h2 = _hessian(96, seed=1, dead=2), _hessian(64, seed=2)
    shapes = [(96, 24, h), (96, 8, h.copy()), (64, 70, h2), (96, 5, None), (96, 40, h)]
    jobs = [
        quant_methods.Job(rng.standard_normal((K, M)).astype(np.float32), hk, 4, 32)
        for K, M, hk in shapes
    ]
    seen = []
    got = quant_methods.quantize_many(jobs, "gptq", seen.append, workers=2)
    for j, qz in zip(jobs, got, strict=True):
        want = quant_methods.quantize_weight(j.w, "gptq", 4, 32, j.h)
        _same(qz, (want.q, want.scale, want.minimum))
    assert sorted(seen) == seen == list(range(1, len(jobs) + 1))
    assert len(quant_methods._shared_groups(jobs)) == 2  # h three times (one a copy), h2


def test_the_reference_catches_a_wrong_gptq(monkeypatch):
    """The bit-for-bit check can fail: GPTQ whose blocks lose their errors' update of the
    rows after them (the matmul after each block of 128) is caught."""
    block = quant_methods._gptq_block
    monkeypatch.setattr(quant_methods, "_gptq_block", lambda *a: 0 * block(*a))
    w = np.random.default_rng(0).standard_normal((160, 8)).astype(np.float32)
    h = _hessian(160, seed=0)
    got = quant_methods.quantize_gptq(w, h, 4, 32)
    assert not np.array_equal(got.q, _reference_gptq(w, h, 4, 32)[0])


# ----------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def calib(model):
    return calibration.default_sequences(model, calibration.Plan(prompts=8, answer_tokens=8))


@pytest.fixture(scope="module")
def quantized(model, calib):
    """(method, head_bits) -> the model quantized at group 16, built once per module."""
    cache = {}

    def get(method, head_bits=None):
        if (method, head_bits) not in cache:
            cache[method, head_bits] = jaxspec.quantize(
                model, "w4a16", 16, method=method, head_bits=head_bits, calibration=calib
            )
        return cache[method, head_bits]

    return get


@pytest.mark.parametrize(("method", "head_bits"), [("asym", None), ("clip", 8), ("gptq", None)])
def test_served_logits_are_those_of_the_dequantized_weights(model, quantized, method, head_bits):
    q = quantized(method, head_bits)
    spec = quant_spec(q)
    assert (spec.method, spec.head_bits) == (method, head_bits)
    assert "kernel" not in str(jax.tree_util.tree_structure(q.params))
    emb = q.params["embed_tokens"]
    assert emb["qweight"].dtype == (np.int8 if head_bits == 8 else np.uint8)
    assert emb["minimum"].dtype == emb["scale"].dtype == np.float16
    got = logits(q)
    np.testing.assert_allclose(got, logits(dequantize(q)), atol=2e-4, rtol=0)
    assert np.abs(got - logits(model)).max() > 1e-3  # quantization really happened


def test_asymmetric_checkpoints_load_as_stored(tmp_path, quantized, monkeypatch):
    q = quantized("clip", 8)
    jaxspec.save(q, tmp_path / "q")
    monkeypatch.setattr(quant_methods, "quantize_weight", lambda *a: pytest.fail("re-quantized"))
    loaded = jaxspec.load(tmp_path / "q")
    assert quant_spec(loaded) == quant_spec(q)
    np.testing.assert_array_equal(logits(loaded), logits(q))


def test_a_gptq_self_draft_keeps_greedy_tokens_and_is_closer_than_min_max(model, quantized):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    plain = jaxspec.generate(model, prompts, 8, temperature=0)
    out = jaxspec.generate(model, prompts, 8, temperature=0, draft=quantized("gptq"), gamma=4)
    assert out.tokens == plain.tokens
    errs = {m: np.abs(logits(quantized(m)) - logits(model)).mean() for m in ("gptq", "asym")}
    assert errs["gptq"] < errs["asym"], errs


def test_progress_reports_each_stage_from_its_start(model):
    """GPTQ without calibration: answers, hessians, weights in order, each first at 0 as it
    begins (the user sees the stage before its first part ends), then up to its total."""
    seen = []
    jaxspec.quantize(model, "w4a16", 16, progress=lambda *a: seen.append(a))
    stages = [s for s, *_ in seen]
    assert sorted(set(stages), key=stages.index) == ["answers", "hessians", "weights"]
    for stage in ("answers", "hessians", "weights"):
        counts = [(d, t) for s, d, t in seen if s == stage]
        assert counts[0][0] == 0 and counts[-1][0] == counts[-1][1] > 0, (stage, counts)
        assert [d for d, _ in counts] == sorted(d for d, _ in counts)
    weights = [d for s, d, _ in seen if s == "weights"]
    assert weights == list(range(len(weights)))  # one call per weight


def test_methods_and_heads_are_checked(model, quantized):
    with pytest.raises(ValueError, match="unknown method"):
        jaxspec.quantize(model, "w4a16", 16, method="awq")
    with pytest.raises(ValueError, match="w4a4"):
        jaxspec.quantize(model, "w4a4", 16, method="clip")
    with pytest.raises(ValueError, match="head_bits"):
        jaxspec.quantize(model, "w4a16", 16, method="clip", head_bits=3)
    with pytest.raises(ValueError, match="already quantized"):
        jaxspec.quantize(quantized("asym"), "w4a16")


def test_calibration_prompts_never_come_from_held_out_sources():
    calib = calibration.chat_prompts(400, seed=0)
    held = calibration.chat_prompts(400, seed=0, heldout=True)
    assert len(calib) >= 250 and len(held) > 50
    assert not {s for s, _ in calib} & {s for s, _ in held}
    assert all(calibration.is_heldout(s) for s, _ in held)
    assert calibration.chat_prompts(20, seed=0) == calib[:20]  # seeded


def test_hessians_cover_every_linear_layer(model, calib):
    hs = calibration.hessians(model, calib, calibration.Plan(window=16, batch=2))
    assert len(hs) == model.config.num_hidden_layers * 7 + 1  # + the tied head's input
    assert hs[("embed_tokens",)].shape == (32, 32)
    h = hs[("layers_0", "mlp", "down_proj")]
    assert h.shape == (72, 72)
    np.testing.assert_allclose(h, h.T, rtol=1e-5, atol=1e-8)
    assert np.all(np.linalg.eigvalsh(h) > -1e-6)  # X^T X is positive semi-definite


def test_the_probe_compiled_ahead_gives_the_same_hessians(model, calib):
    """quantize() compiles the probe on a second thread during the answers: the same H."""
    plan = calibration.Plan(window=16, batch=2)
    compiled = calibration.compiled_probe(model, plan)
    calls = []

    def probe(params, toks):
        calls.append(toks.shape)
        return compiled(params, toks)

    got = calibration.hessians(model, calib, plan, probe=probe)
    want = calibration.hessians(model, calib, plan)
    assert calls and set(calls) == {(2, 16)}
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_blas_runs_on_one_thread_per_worker_and_is_restored(monkeypatch):
    """quantize_many's pool keeps numpy's OpenBLAS to one thread while it runs."""
    blas = quant_methods._openblas_threads()
    if blas is None:
        pytest.skip("numpy's BLAS is not a loaded OpenBLAS here")
    seen = []
    monkeypatch.setattr(quant_methods, "_blas_setter", lambda get, put: seen.append(get) or None)
    quant_methods._openblas_threads()
    get = seen[0]
    before = get()
    with blas(1):
        assert get() == 1
    assert get() == before
