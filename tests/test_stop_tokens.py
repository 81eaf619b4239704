"""Stop tokens inside a verified block: the verifier cuts the block at the stop token, the edge
ends there, and the output equals co-located decoding token for token, through the in-process
verifier and through the gRPC service (a `python -m verify serve` subprocess on loopback).

The tiny random models never emit their EOS, so each case takes as stop token one that the
session emits mid-sequence (first seen at new-token index 8..15) as an accepted draft with more
tokens emitted after it in the same block: without the cut, the session would go on past it.
"""

from __future__ import annotations

import functools

import jax
import pytest

import jaxspec
from jaxspec.ckpts.checkpoint import save
from tests import grpc_helpers as h
from verify import Scheduler

PROMPT, NEW, GAMMA, SEED = (1, 2, 3, 4), 24, 4, 5

# (mode, temperature, encoding, draft). Greedy drafts from an independent random model hardly
# ever match the target's argmax (no draft is accepted: no stop token could fall inside a
# block); the "close" draft (the target's weights mixed 9:1 with the other's) agrees often but
# not always. Sampled, the independent draft is accepted often, not always.
CASES = [
    ("sync", 0.0, "onehot", "close"),
    ("pipelined", 0.0, "full", "close"),
    ("sync", 1.0, "full", "random"),
    ("pipelined", 1.0, "full", "random"),
]
IDS = [f"{m}-t{t:g}-{e}" for m, t, e, _ in CASES]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny target and drafts as checkpoints, and a plaintext server of the target."""
    root = tmp_path_factory.mktemp("stop")
    target, draft = h.write_models(root)
    t, d = jaxspec.load(target), jaxspec.load(draft)
    close = t.with_params(jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, t.params, d.params))
    drafts = {"random": draft, "close": save(close, root / "close")}
    server = h.spawn(target, env=h.server_env(root / "jax-cache"))
    try:
        yield dict(target=target, drafts=drafts, server=server)
    finally:
        assert server.stop() == 0, server.log_tail()


@functools.cache
def _model(path: str) -> jaxspec.Model:
    return jaxspec.load(path)


def _config(mode: str, temperature: float, encoding: str, stop_tokens: tuple[int, ...]):
    return h.config(
        prompt=PROMPT, max_new_tokens=NEW, mode=mode, temperature=temperature, seed=SEED,
        gamma=GAMMA, encoding=encoding, stop_tokens=stop_tokens,
    )  # fmt: skip


def _colocated(world, case, stop_tokens: tuple[int, ...]) -> list[int]:
    """Co-located speculative decoding (one process, no protocol) with the same draws."""
    mode, temperature, encoding, draft = case
    return jaxspec.generate(
        _model(str(world["target"])),
        list(PROMPT),
        NEW,
        draft=_model(str(world["drafts"][draft])),
        gamma=GAMMA,
        mode=mode,
        encoding=encoding,
        sparse_k=4,
        temperature=temperature,
        seeds=[SEED],
        stop_tokens=list(stop_tokens),
    ).tokens


def _blocks(trace) -> list[list[int]]:
    """The tokens each verified block committed, in order, from a session's events: "accept"
    opens a block, a "correct"/"bonus" token ends it."""
    out: list[list[int]] = []
    for kind, toks in trace.events:
        if kind == "accept":
            out.append(list(toks))
        elif kind in ("correct", "bonus"):
            out[-1] += toks
    return out


def _cut_inside_a_block(trace, mode: str) -> bool:
    """The session's last block was cut after the stop token: it committed no correction or
    bonus (a sync block always emits one), and in pipelined mode drafts were dropped (the
    "reject" of drafts past the cut; a rejection would have emitted a correction)."""
    tail = [kind for kind, _ in trace.events]
    tail = tail[len(tail) - 1 - tail[::-1].index("accept") :]
    no_next = "correct" not in tail and "bonus" not in tail
    return no_next and (mode == "sync" or "reject" in tail)


def _local(world, case, stop_tokens):
    mode, temperature, encoding, draft = case
    cfg = _config(mode, temperature, encoding, stop_tokens)
    return h.run(h.local_session(world["target"], world["drafts"][draft], cfg))


def _pick_stop(world, case) -> tuple[int, int]:
    """(stop token, its index) for `case`: the first token of the unstopped session at new-token
    index 8..15, not emitted before, committed inside a block with more tokens after it."""
    free = _local(world, case, ())
    assert free.tokens == _colocated(world, case, ())
    assert sum(map(len, _blocks(free))) == NEW
    index = 0
    for block in _blocks(free):
        for j, tok in enumerate(block):
            if 8 <= index <= 15 and j < len(block) - 1 and tok not in free.tokens[:index]:
                return tok, index
            index += 1
    raise AssertionError(f"no stop token candidate inside a block: {_blocks(free)}")


@pytest.fixture(scope="module")
def stops(world):
    """case -> (stop token, its index, co-located decoding's tokens with that stop token)."""
    out = {}
    for case in CASES:
        tok, index = _pick_stop(world, case)
        out[case] = (tok, index, _colocated(world, case, (tok,)))
        if case[1] == 0.0:  # greedy: speculative decoding is plain decoding, stop included
            target = _model(str(world["target"]))
            plain = jaxspec.generate(target, list(PROMPT), NEW, temperature=0.0, stop_tokens=[tok])
            assert out[case][2] == plain.tokens
    return out


def _check(trace, mode, ref, tok, index) -> None:
    assert trace.tokens == ref
    assert len(ref) == index + 1 and ref[-1] == tok and tok not in ref[:-1]
    assert _cut_inside_a_block(trace, mode), trace.events[-4:]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_in_process_verifier_cuts_at_the_stop_token_like_colocated(world, stops, case):
    """Edge drafter + LocalVerifier: the block holding the stop token is cut right after it,
    the session ends, and the tokens equal co-located decoding's with that stop token."""
    tok, index, ref = stops[case]
    _check(_local(world, case, (tok,)), case[0], ref, tok, index)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grpc_service_cuts_at_the_stop_token_like_colocated(world, stops, case):
    """The same over gRPC (the stop tokens travel in OpenSession): the same tokens."""
    mode, temperature, encoding, draft = case
    tok, index, ref = stops[case]
    cfg = _config(mode, temperature, encoding, (tok,))
    trace = h.run(h.session(world["server"].address, world["drafts"][draft], cfg))
    _check(trace, mode, ref, tok, index)


def test_a_verifier_that_ignores_stop_tokens_is_caught(world, stops, monkeypatch):
    """The checks above can fail: a verifier that never cuts nor finishes at a stop token runs
    past it, and `_check` rejects the output."""
    monkeypatch.setattr(Scheduler, "_stops", lambda self, c: frozenset())
    for case in (CASES[0], CASES[3]):
        tok, index, ref = stops[case]
        trace = _local(world, case, (tok,))
        assert len(trace.tokens) == NEW and trace.tokens[: index + 1] == ref
        with pytest.raises(AssertionError):
            _check(trace, case[0], ref, tok, index)
