"""The asymmetric quantizers (asym, clip, GPTQ), the int8 head (GGUF's Q8_0 rule), calibration
data, and the packed copies of a model served through the same AQT int dot path."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import jaxspec
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.quant import calibration
from jaxspec.quant import methods as quant_methods
from jaxspec.quant.layers import quant_spec, with_kernel
from jaxspec.quant.quantize import dequantize

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


def _ggml_q8_0(w_KM: np.ndarray, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [K, M], d float16 [K/group, M]) of the `gguf` package's Q8_0 quantizer (ggml's
    `quantize_row_q8_0`, bit for bit) over each column of `w` in blocks of `group` rows."""
    from gguf import GGMLQuantizationType, quants

    K, M = w_KM.shape
    rows = np.ascontiguousarray(w_KM.T.reshape(M * K // group, group), np.float32)
    if group != 32:  # Q8_0's blocks are 32 long: pad each group with zeros (no max changes)
        rows = np.pad(rows, ((0, 0), (0, 32 - group)))
    blocks = quants.quantize(rows, GGMLQuantizationType.Q8_0).reshape(M, K // group, 34)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].T
    q = blocks[..., 2:].copy().view(np.int8)[..., :group].reshape(M, K).T
    return q, d


def _q8_0_hard_cases(seed: int = 0) -> np.ndarray:
    """A [96, 40] float32 weight with what a rounding rule can get wrong: exact ties
    (amax 127 makes d = 1: 2.5 must round to 3, not to even 2), a value just under a half
    (0.49999997 rounds to 0), an all-zero group (d = 0, q = 0), tiny and huge magnitudes."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((96, 40)) * 0.05).astype(np.float32)
    w[:32, 0] = 0.0
    w[:32, 1] = np.float32(0.49999997)
    w[0, 1] = 127.0
    w[:32, 2] = np.arange(32) - 15.5
    w[0, 2] = 127.0
    w[32:64, 3] *= 1e-6
    w[64:, 4] *= 1e3
    return w


def test_absmax_at_8_bits_is_ggml_q8_0_bit_for_bit():
    """The head's rule ("absmax") is ggml's Q8_0 quantizer (the `gguf` package's port): the
    same ints and float16 scales on random weights and on every hard case, at group 32 and
    at another group; no minimum is stored."""
    w = _q8_0_hard_cases()
    for group in (32, 16):
        got = quant_methods.quantize_weight(w, "absmax", 8, group)
        q, d = _ggml_q8_0(w, group)
        assert got.minimum is None and got.scale.dtype == np.float16 and got.q.dtype == np.int8
        np.testing.assert_array_equal(got.q, q)
        np.testing.assert_array_equal(got.scale, d)
    assert got.q[1:4, 2].tolist() == [-15, -14, -13]  # -14.5, -13.5, -12.5: away from zero
    np.testing.assert_array_equal(
        got.dequant(16), got.q * np.repeat(got.scale, 16, 0).astype(np.float32)
    )


@pytest.mark.parametrize("mutant", ["rint", "floor_plus_half", "scale_in_float16"])
def test_the_q8_0_check_catches_a_wrong_rounding_rule(monkeypatch, mutant):
    """Each wrong rule the check above must catch: numpy's ties-to-even, floor(|x| + 0.5)
    (wrong just under a half), and q computed from the float16-rounded scale."""
    if mutant == "scale_in_float16":
        true = quant_methods.quantize_absmax

        def wrong(w, bits, group):
            got = true(w, bits, group)
            s = np.repeat(got.scale.astype(np.float32), group, 0)[: w.shape[0]]
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.where(s == 0, 0, quant_methods.round_half_away(w / s))
            return quant_methods.Quantized(q.astype(np.int8), got.scale, None, bits)

        monkeypatch.setattr(quant_methods, "quantize_absmax", wrong)
    else:
        rule = {
            "rint": np.rint,
            "floor_plus_half": lambda x: np.sign(x) * np.floor(np.abs(x) + np.float32(0.5)),
        }[mutant]
        monkeypatch.setattr(quant_methods, "round_half_away", rule)
    w = _q8_0_hard_cases()
    w[32:, 5:] = np.random.default_rng(7).standard_normal((64, 35)) * 3e-3  # many values
    got = quant_methods.quantize_weight(w, "absmax", 8, 32)
    assert not np.array_equal(got.q, _ggml_q8_0(w)[0])


def test_absmax_gives_a_q8_0_table_back_exactly():
    """A table that is Q8_0 (float16 d times q, max |q| 127 as ggml makes it) comes back as
    its own ints and scales."""
    rng = np.random.default_rng(4)
    d = (rng.random((3, 40)) * 0.01 + 1e-4).astype(np.float16)
    q = rng.integers(-127, 128, (96, 40)).astype(np.int8)
    q[::32] = 127 * rng.choice([-1, 1], (3, 40))
    w = q.astype(np.float32) * np.repeat(d.astype(np.float32), 32, 0)
    got = quant_methods.quantize_weight(w, "absmax", 8, 32)
    np.testing.assert_array_equal(got.q, q)
    np.testing.assert_array_equal(got.scale, d)
    np.testing.assert_array_equal(got.dequant(32), w)


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
    for a, b in zip((got.q, got.scale, got.minimum)[: len(want)], want, strict=True):
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
    without a Hessian is the clipping search, one with a method of its own ("absmax": the
    head) is that method's even with a Hessian; progress counts weights as they finish."""
    monkeypatch.setattr(quant_methods, "PIECE_COLUMNS", 16)
    rng = np.random.default_rng(3)
    h, h2 = _hessian(96, seed=1, dead=2), _hessian(64, seed=2)
    shapes = [(96, 24, h, None), (96, 8, h.copy(), None), (64, 70, h2, None),
              (96, 5, None, None), (96, 40, h, None), (96, 50, h, "absmax")]  # fmt: skip
    jobs = [
        quant_methods.Job(rng.standard_normal((K, M)).astype(np.float32), hk, 4, 32, how)
        for K, M, hk, how in shapes
    ]
    seen = []
    got = quant_methods.quantize_many(jobs, "gptq", seen.append, workers=2)
    for j, qz in zip(jobs, got, strict=True):
        want = quant_methods.quantize_weight(j.w, j.method or "gptq", 4, 32, j.h)
        if j.method == "absmax":
            assert qz.minimum is None
            _same(qz, (want.q, want.scale))
        else:
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
    """(method, head_bits, head_method) -> the model quantized at group 16, built once per
    module."""
    cache = {}

    def get(method, head_bits=None, head_method=None):
        key = (method, head_bits, head_method)
        if key not in cache:
            cache[key] = jaxspec.quantize(
                model, "w4a16", 16, method=method, head_bits=head_bits, head_method=head_method,
                calibration=calib,
            )  # fmt: skip
        return cache[key]

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


@pytest.mark.parametrize("head", [(8, None), (8, "absmax")])
def test_asymmetric_checkpoints_load_as_stored(tmp_path, quantized, monkeypatch, head):
    q = quantized("clip", *head)
    d = jaxspec.save(q, tmp_path / "q")
    monkeypatch.setattr(quant_methods, "quantize_weight", lambda *a: pytest.fail("re-quantized"))
    loaded = jaxspec.load(d)
    assert quant_spec(loaded) == quant_spec(q)
    np.testing.assert_array_equal(logits(loaded), logits(q))
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["quantization_config"]["head_method"] == head[1]
    if head[1] is None:  # a file from before head_method: its head is the body's method
        del cfg["quantization_config"]["head_method"]
        (d / "config.json").write_text(json.dumps(cfg))
        assert quant_spec(jaxspec.load(d)) == quant_spec(q)
    else:
        cfg["quantization_config"]["head_method"] = "awq"
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(jaxspec.CheckpointError, match="head_method"):
            jaxspec.load(d)


def test_an_absmax_head_is_q8_0_of_the_float_table_and_gptq_leaves_it_alone(model, quantized):
    """head_bits=8, head_method="absmax" beside a GPTQ body: the tied head is the float
    table's Q8_0 (`quantize_absmax`; no Hessian, no error feedback), stored int8 [H, V] with
    float16 scales [H / 16, V] and no minimum; the body is the same as with any other head;
    served logits are the dequantized weights'."""
    q = quantized("gptq", 8, "absmax")
    spec = quant_spec(q)
    assert (spec.method, spec.head_bits, spec.head_method) == ("gptq", 8, "absmax")
    head = spec.head()
    assert (head.method, head.weight_bits, head.asymmetric) == ("absmax", 8, False)
    H, V = model.config.hidden_size, model.config.vocab_size
    emb = q.params["embed_tokens"]
    assert set(emb) == {"qweight", "scale"}
    assert (emb["qweight"].dtype, emb["qweight"].shape) == (np.int8, (H, V))
    assert (emb["scale"].dtype, emb["scale"].shape) == (np.float16, (H // 16, V))
    table = np.asarray(model.params["embed_tokens"]["embedding"], np.float32)  # [V, H]
    want = quant_methods.quantize_absmax(table.T, 8, 16)
    np.testing.assert_array_equal(np.asarray(emb["qweight"]), want.q)
    np.testing.assert_array_equal(np.asarray(emb["scale"]), want.scale)
    other = quantized("gptq")  # an int4 GPTQ head: the body is untouched by the head's method
    body, other_body = q.params["layers_0"], other.params["layers_0"]
    for a, b in zip(jax.tree.leaves(body), jax.tree.leaves(other_body), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(logits(q), logits(dequantize(q)), atol=2e-4, rtol=0)


def test_the_absmax_head_runs_on_the_int8_kernel_as_on_xlas_path(quantized):
    """Decode-sized rows of a symmetric int8 head go to `jaxspec.kernels.int8` (int8 [K, M]
    and the float16 scales as stored) where it is built, else through AQT's int dot: the same
    logits to float rounding, and `with_kernel(False)` turns it off."""
    from jaxspec import kernels
    from jaxspec.kernels import int8 as int8kernel

    q = quantized("gptq", 8, "absmax")
    head = quant_spec(q).head()
    assert head.int8_symmetric and not quant_spec(q).int8_symmetric  # the int4 body is not
    xla = with_kernel(q, False)
    np.testing.assert_allclose(logits(q), logits(xla), atol=1e-4, rtol=0)
    pos = np.broadcast_to(np.arange(IDS.shape[1]), IDS.shape)

    def lowered(m):
        return jax.jit(lambda i, p: m(i, p, m.init_cache(2, 8))[0]).lower(IDS, pos).as_text()

    assert (int8kernel.TARGET in lowered(q)) == kernels.available()
    assert int8kernel.TARGET not in lowered(xla)


def test_a_table_that_was_q8_0_is_the_drafts_own_head(model):
    """A target whose tied table is Q8_0 at the group (SmolLM2's is): the absmax head gives
    back exactly the target's table, an asymmetric int8 head (what head_bits=8 alone gives)
    does not."""
    table = np.asarray(model.params["embed_tokens"]["embedding"], np.float32)
    on_grid = quant_methods.quantize_absmax(table.T, 8, 16).dequant(16).T  # [V, H]
    params = {**model.params, "embed_tokens": {"embedding": on_grid}}
    target = model.with_params(params)
    for head_method, exact in (("absmax", True), (None, False)):
        q = jaxspec.quantize(target, "w4a16", 16, method="asym", head_bits=8,
                             head_method=head_method)  # fmt: skip
        got = np.asarray(dequantize(q).params["embed_tokens"]["embedding"])
        assert np.array_equal(got, on_grid) == exact, head_method


def test_an_untied_lm_head_takes_the_head_method():
    cfg = tiny_config(tie_word_embeddings=False, intermediate_size=72)
    m = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 4), name="untied")
    q = jaxspec.quantize(m, "w4a16", 16, method="clip", head_bits=8, head_method="absmax")
    for name in ("lm_head", "embed_tokens"):
        assert set(q.params[name]) == {"qweight", "scale"}, name
        assert q.params[name]["qweight"].dtype == np.int8
    kernel = np.asarray(m.params["lm_head"]["kernel"], np.float32)  # [H, V]
    np.testing.assert_array_equal(
        np.asarray(q.params["lm_head"]["qweight"]), quant_methods.quantize_absmax(kernel, 8, 16).q
    )
    np.testing.assert_allclose(logits(q), logits(dequantize(q)), atol=2e-4, rtol=0)


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
    with pytest.raises(ValueError, match="unknown head_method"):
        jaxspec.quantize(model, "w4a16", 16, method="clip", head_method="gptq")
    with pytest.raises(ValueError, match="rtn"):
        jaxspec.quantize(model, "w4a16", 16, method="rtn", head_bits=8, head_method="absmax")
    with pytest.raises(ValueError, match="embeddings=False"):
        jaxspec.quantize(model, "w4a16", 16, method="clip", head_method="absmax", embeddings=False)


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
