"""Plain decoding: the reference decoder, against transformers and against itself."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec.ckpts.tiny import to_dtype
from jaxspec.decoding.generate import _decode


@pytest.fixture(scope="module")
def gqa(hf_checkpoints):
    d, oracle = hf_checkpoints["gqa"]
    return jaxspec.load(d), oracle


def hf_greedy(oracle, prompt, n, eos=None):
    kw = {} if eos is None else {"eos_token_id": eos}
    with torch.no_grad():
        out = oracle.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            **kw,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("name", ["gqa", "mqa_tied", "qwen2", "llama3_rope"])
def test_greedy_equals_transformers_greedy(hf_checkpoints, name):
    d, oracle = hf_checkpoints[name]
    model = jaxspec.load(d)
    rng = np.random.RandomState(4)
    prompts = [rng.randint(0, 64, n).tolist() for n in (1, 7, 12)]
    out = jaxspec.generate(model, prompts, 24, temperature=0.0)
    for p, got in zip(prompts, out.tokens, strict=True):
        assert got == hf_greedy(oracle, p, 24)
    assert out.padded.shape == (3, 24)
    assert out.stats.new_tokens == 72 and out.stats.tokens_per_s > 0


def test_stop_tokens_end_rows_like_transformers_eos(gqa):
    model, oracle = gqa
    prompts = [[3, 4, 5], [9, 1], [60, 61, 62, 63]]
    free = jaxspec.generate(model, prompts, 16, temperature=0.0)
    stop = free.tokens[0][5]  # a token row 0 produces mid-way
    out = jaxspec.generate(model, prompts, 16, temperature=0.0, stop_tokens=[stop])
    for p, row, full in zip(prompts, out.tokens, free.tokens, strict=True):
        cut = full.index(stop) + 1 if stop in full else len(full)
        assert row == full[:cut] == hf_greedy(oracle, p, 16, eos=stop)
    n0 = len(out.tokens[0])
    assert out.tokens[0][-1] == stop and n0 < 16
    assert (out.padded[0, n0:] == -1).all()


def test_a_thousand_prompts(gqa):
    model, _ = gqa
    rng = np.random.RandomState(5)
    prompts = [rng.randint(0, 64, rng.randint(1, 12)).tolist() for _ in range(1000)]
    out = jaxspec.generate(model, prompts, 4, temperature=0.0, max_batch=256)
    assert out.padded.shape == (1000, 4) and (out.padded >= 0).all()
    for i in (0, 257, 999):
        assert jaxspec.generate(model, prompts[i], 4, temperature=0.0).tokens == out.tokens[i]


def test_single_prompt_gives_a_flat_list(gqa):
    model, _ = gqa
    out = jaxspec.generate(model, np.array([1, 2, 3]), 5, temperature=0.0)
    assert isinstance(out.tokens, list) and len(out.tokens) == 5
    assert isinstance(out.tokens[0], int)


def test_new_sampling_values_do_not_recompile(gqa):
    model, _ = gqa
    prompts = [[1, 2, 3], [4, 5]]
    first = jaxspec.generate(model, prompts, 8, temperature=0.0)
    # Compilation is timed apart from generation: compile_s > 0 exactly when it compiled.
    assert first.stats.compiled == (first.stats.compile_s > 0)
    before = _decode._cache_size()
    for kw in [
        {"temperature": 0.7, "top_k": 5, "seed": 1},
        {"temperature": [0.0, 1.3], "top_p": [0.9, 0.5], "seeds": [7, 8]},
        {"temperature": 1.0, "top_k": [0, 3]},
    ]:
        out = jaxspec.generate(model, prompts, 8, **kw)
        assert not out.stats.compiled and out.stats.compile_s == 0.0
        assert out.stats.wall_s > 0
    assert _decode._cache_size() == before


def test_seeds_make_sampling_reproducible_and_rows_independent(gqa):
    """A row's tokens depend on its own key only: decoded alone or among others, in any
    bucket, the same (float64, so no float near-tie can flip a draw)."""
    model, _ = gqa
    with jax.enable_x64(True):
        m64 = to_dtype(model, np.float64)
        prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14], [15]]
        seeds = [11, 12, 13, 14]
        batch = jaxspec.generate(m64, prompts, 12, temperature=0.9, top_p=0.9, seeds=seeds)
        for p, s, row in zip(prompts, seeds, batch.tokens, strict=True):
            alone = jaxspec.generate(m64, p, 12, temperature=0.9, top_p=0.9, seeds=[s])
            assert alone.tokens == row
        again = jaxspec.generate(m64, prompts, 12, temperature=0.9, top_p=0.9, seeds=seeds)
        assert again.tokens == batch.tokens
        other = jaxspec.generate(m64, prompts, 12, temperature=0.9, top_p=0.9, seed=0)
        assert other.tokens != batch.tokens


@pytest.mark.parametrize(
    ("prompts", "kw", "message"),
    [
        ([], {}, "empty"),
        ([[1, 2], []], {}, "prompt 1 is empty"),
        ([1, 64], {}, "outside"),
        ([1, -1], {}, "outside"),
        ([1, 2], {"max_new_tokens": 0}, "max_new_tokens"),
        ([1] * 500, {"max_new_tokens": 20}, "max_position_embeddings"),
        ([1, 2], {"temperature": -1.0}, "temperature"),
        ([[1], [2]], {"seeds": [1]}, "seeds"),
    ],
)
def test_bad_requests_raise_value_error(gqa, prompts, kw, message):
    model, _ = gqa
    with pytest.raises(ValueError, match=message):
        jaxspec.generate(model, prompts, **kw)
