"""Golden vectors of the key derivation (docs/design.md §2): literal values that a second
implementation of the protocol can check itself against.

A session's draw for `purpose` at absolute `position` uses the key
`fold_in(fold_in(fold_in(PRNGKey(seed), row), position), purpose)` (threefry, JAX's default)
and the float32 uniform `jax.random.uniform(key)`. The draws stay lossless under any other
fixed scheme (e.g. purpose folded before position), so only literal values pin this one: they
are checked on the helpers, spelled out with raw `jax.random` calls, and through the code paths
that really derive the keys (plain `generate` and the verifier's step). A mutant with the two
`fold_in`s swapped is run through the same paths and must miss the literals.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
import jaxspec.decoding.sampling
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.decoding.sampling import Purpose, position_key, session_key, session_keys, uniforms
from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig
from verify import Scheduler, SchedulerConfig

# (seed, row, position, purpose) -> session key words, position key words, the uniform
# (float32, as Python's repr of the float, and its bit pattern).
GOLDEN = [
    ((0, 0, 0, Purpose.TARGET), (1797259609, 2579123966), (3060127571, 4206868567),
     0.8384559154510498, 1062642956),
    ((3, 0, 5, Purpose.ACCEPT), (3716834203, 3481239269), (1265165813, 284711209),
     0.6602293252944946, 1059652810),
    ((12345, 2, 17, Purpose.RESIDUAL), (795667951, 2300365598), (851234633, 4184771261),
     0.5629884004592896, 1058021378),
    ((2**32 - 1, 1, 100, Purpose.DRAFT), (3461607691, 1112781462), (1050664219, 180833058),
     0.801201343536377, 1062017928),
    ((7, 0, 63, Purpose.BONUS), (3625411723, 1954958720), (1950265468, 2701241140),
     0.46612095832824707, 1055827816),
]  # fmt: skip

# Plain `generate` with an all-zero model (uniform next-token distribution, so token =
# floor(u * V)), two prompts of lengths 3 and 5, seed 12345 (row i: fold_in(PRNGKey(12345), i)),
# temperature 1: the TARGET draws at positions 3..10 and 5..12.
GENERATE_PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8]]
GENERATE_TOKENS = [[41, 1, 25, 15, 5, 13, 60, 37], [6, 23, 18, 17, 39, 52, 7, 9]]

# The verifier (Scheduler) with the all-zero target, one sync session (seed 3, prompt of 3
# tokens, 12 new tokens), every block four drafts of token 0 with full q(0) = 2/V: each draft
# is accepted iff U(ACCEPT) < p/q = 1/2; a rejection draws the correction from U(RESIDUAL), a
# fully accepted block its bonus from U(BONUS). (accepted, committed tokens) per block:
VERIFIER_BLOCKS = [(2, (0, 0, 48)), (4, (0, 0, 0, 0, 55)), (0, (40,)), (3, (0, 0, 0))]


def _words(key) -> tuple[int, ...]:
    return tuple(int(w) for w in np.asarray(key, np.uint32))


def _raw_uniform(seed: int, row: int, position: int, purpose: int) -> np.float32:
    """The documented scheme, with no jaxspec code: seed, then row, then position, then
    purpose."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), row)
    key = jax.random.fold_in(jax.random.fold_in(key, position), purpose)
    return np.float32(jax.random.uniform(key, dtype=jnp.float32))


def _swapped_position_key(key, position, purpose):
    """The mutant: purpose folded in before position."""
    return jax.random.fold_in(jax.random.fold_in(key, purpose), position)


@contextlib.contextmanager
def _mutant_keys(monkeypatch: pytest.MonkeyPatch):
    """Every draw derived with `_swapped_position_key` while inside (compiled functions are
    dropped on the way in and out: a cached trace would keep the other scheme)."""
    jax.clear_caches()
    monkeypatch.setattr(jaxspec.decoding.sampling, "position_key", _swapped_position_key)
    try:
        yield
    finally:
        monkeypatch.undo()
        jax.clear_caches()


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("case", GOLDEN, ids=[g[0][3].name for g in GOLDEN])
def test_keys_and_uniforms_match_the_golden_vectors(case, x64):
    """Literal key words and uniforms, from the helpers, from `uniforms` (what every sampler
    and the verifier call) and from raw `jax.random` calls; the same under x64 (the float64
    tests and verifiers draw exactly what float32 ones do)."""
    (seed, row, position, purpose), sk, pk, u, bits = case
    with jax.enable_x64(x64):
        key = session_key(seed, row)
        assert _words(key) == sk
        assert _words(session_keys(seed, row + 1)[row]) == sk
        if row == 0:
            assert _words(session_keys([seed], 1)[0]) == sk
        assert _words(position_key(key, position, purpose)) == pk
        raw = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), row), position)
        assert _words(jax.random.fold_in(raw, purpose)) == pk

        got = np.float32(uniforms(key[None], jnp.asarray([[position]]), purpose)[0, 0])
        assert float(got) == u and int(got.view(np.uint32)) == bits
        assert _raw_uniform(seed, row, position, int(purpose)) == got


def test_the_swapped_fold_in_misses_every_golden_vector(monkeypatch):
    """The test above can fail: purpose before position gives other keys and uniforms."""
    with _mutant_keys(monkeypatch):
        for (seed, row, position, purpose), _, pk, u, _ in GOLDEN:
            key = session_key(seed, row)
            assert _words(jaxspec.decoding.sampling.position_key(key, position, purpose)) != pk
            got = float(uniforms(key[None], jnp.asarray([[position]]), purpose)[0, 0])
            assert got != u


def _zero_model() -> jaxspec.Model:
    """A tiny model whose logits are all zero: every next-token distribution is uniform."""
    cfg = tiny_config()
    params = jax.tree.map(jnp.zeros_like, jaxspec.init_params(cfg, 0))
    return jaxspec.Model(config=cfg, params=params)


def _generate_tokens(model: jaxspec.Model) -> list[list[int]]:
    return jaxspec.generate(model, GENERATE_PROMPTS, 8, temperature=1.0, seed=12345).tokens


def _verifier_blocks(model: jaxspec.Model) -> list[tuple[int, tuple[int, ...]]]:
    """One sync session through the Scheduler (the verifier's jitted step derives the keys
    from the session config); returns (accepted, tokens) per block."""
    V = model.config.vocab_size
    sched = Scheduler(
        model, SchedulerConfig(max_sessions=1, max_len=64, max_gamma=4, row_buckets=(1,))
    )
    config = SessionConfig(
        prompt=(1, 2, 3),
        max_new_tokens=12,
        mode="sync",
        sampling=SamplingSettings(temperature=1.0),
        seed=3,
        draft=DraftSpec(gamma=4, encoding="full"),
    )
    sid = sched.open(config).session_id
    s = sched.sessions[sid]
    q = np.full((4, V), (1 - 2 / V) / (V - 1))
    q[:, 0] = 2 / V
    out = []
    while not s.finished:
        block = DraftBlock(session_id=sid, epoch=s.epoch, start=s.committed, tokens=(0,) * 4, q=q)
        sched.submit(block)
        while s.queue:
            out += [(r.accepted, r.tokens) for _, r in sched.tick()]
    return out


@pytest.fixture(scope="module")
def zero_model() -> jaxspec.Model:
    return _zero_model()


def test_generate_draws_the_golden_target_uniforms(zero_model):
    """Plain decoding derives its keys as documented: with a uniform distribution the token
    at position P of row i is floor(U(seed 12345, row i, P, TARGET) * V)."""
    assert _generate_tokens(zero_model) == GENERATE_TOKENS
    V = zero_model.config.vocab_size
    for row, (prompt, toks) in enumerate(zip(GENERATE_PROMPTS, GENERATE_TOKENS, strict=True)):
        for j, tok in enumerate(toks):
            u = _raw_uniform(12345, row, len(prompt) + j, Purpose.TARGET)
            assert tok == int(u * V)


def test_the_verifier_draws_the_golden_accept_residual_and_bonus_uniforms(zero_model):
    """The verifier's step derives its keys as documented: each accept decision is
    U(seed 3, row 0, P, ACCEPT) < 1/2 at the draft's absolute position P."""
    got = _verifier_blocks(zero_model)
    assert got == VERIFIER_BLOCKS
    start = 3
    for accepted, toks in got:
        drafts = min(4, len(toks))  # the last block is cut at max_new_tokens
        bits = [_raw_uniform(3, 0, start + j, Purpose.ACCEPT) < 0.5 for j in range(drafts)]
        assert accepted == [*bits, False].index(False)
        start += len(toks)


def test_the_swapped_fold_in_changes_what_generate_and_the_verifier_draw(zero_model, monkeypatch):
    """The two tests above can fail: with the mutant in `jaxspec.decoding.sampling.position_key`
    (which `uniforms`, and so every sampler, the drafter and the verifier, calls) the real code
    paths produce other tokens."""
    with _mutant_keys(monkeypatch):
        mutant_generate = _generate_tokens(zero_model)
        mutant_verifier = _verifier_blocks(zero_model)
    assert mutant_generate != GENERATE_TOKENS
    assert all(a != b for a, b in zip(mutant_generate, GENERATE_TOKENS, strict=True))
    assert mutant_verifier != VERIFIER_BLOCKS
    # Back to the real scheme: the literals again (the mutant's compilations were dropped).
    assert _generate_tokens(zero_model) == GENERATE_TOKENS
