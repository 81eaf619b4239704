"""The deliberately wrong variants (mutants) of the speculative path that the tests keep and
must catch (docs/testing.md): of the rule, of the drafting and of the penalties' counts.

A mutant is a wrong function put, for the duration of `injected(name)`, in place of a
module-level function the serving code calls (the rule's `_accepts`, the drafter's
`draft_q_for`, the scheduler's `_commit`, ...): no parameter of the serving path carries it.
Most are wrappers around the real function, so a mutant restates only what it breaks.

Traced programs must not outlive a mutant: `injected` drops JAX's caches on the way in and on
the way out (`jax.clear_caches`), so the jitted code is traced anew with the mutant inside and
again without it, and it refuses to run with kept traces on (`jaxspec.compilation.trace_cache`,
which tests/conftest.py turns off: its key cannot see a monkeypatched function). It also fails
unless every function it put in place really ran (was traced or called): a test cannot run the
rule as built while it believes it runs a mutant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from jaxspec.compilation import trace_cache
from jaxspec.decoding import speculative, verification
from jaxspec.decoding.generate import decode
from jaxspec.decoding.sampling import Purpose, SamplingParams, session_keys, warp
from jaxspec.nn.model import Model
from jaxspec.protocol import DraftSpec

Patch = tuple[Any, str, Callable]  # (module or class, attribute, the wrong function)


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A named mutant: what it breaks, and `patches()` -> the functions it puts in place."""

    name: str
    breaks: str
    patches: Callable[[], list[Patch]]


MUTANTS: dict[str, Mutant] = {}


def _mutant(name: str, breaks: str) -> Callable:
    def register(patches: Callable[[], list[Patch]]) -> Callable[[], list[Patch]]:
        MUTANTS[name] = Mutant(name, breaks, patches)
        return patches

    return register


# ---- the rule (jaxspec.decoding.verification) ---------------------------------------------


@_mutant("reused_uniform", "one accept uniform for every draft of a block")
def _reused_uniform() -> list[Patch]:
    real = verification.uniforms

    def uniforms(keys_B2, positions_BT, purpose):
        u = real(keys_B2, positions_BT, purpose)
        return jnp.broadcast_to(u[:, :1], u.shape) if purpose == Purpose.ACCEPT else u

    return [(verification, "uniforms", uniforms)]


@_mutant("residual_from_p", "the correction drawn from p, not from max(0, p - q)")
def _residual_from_p() -> list[Patch]:
    return [(verification, "_residual", lambda p_r, q_r: p_r)]


@_mutant("unnormalized_residual", "the residual's draw not scaled by its mass")
def _unnormalized_residual() -> list[Patch]:
    residual_of = verification._residual

    def correction(p_r, q_r, keys_B2, pos_B):
        residual = residual_of(p_r, q_r)
        u = verification.uniforms(keys_B2, pos_B[:, None], Purpose.RESIDUAL)[:, 0]
        cum = jnp.cumsum(residual, axis=-1)
        return jnp.minimum(jnp.sum(cum <= u[:, None], axis=-1), residual.shape[-1] - 1)

    return [(verification, "_correction", correction)]


@_mutant("bonus_from_q", "the bonus drawn from the draft's last q, not from p")
def _bonus_from_q() -> list[Patch]:
    real = verification._decide

    def decide(p_BKV, draft_BK, num_draft_B, draft_q, keys_B2, start_B, bonus_B, dtype):
        # p at position n is read for the bonus alone: put the last draft's q there
        B, _, V = p_BKV.shape
        q_last = draft_q.row(jnp.maximum(num_draft_B - 1, 0), draft_BK, V, dtype)
        p_BKV = p_BKV.at[jnp.arange(B), num_draft_B].set(q_last.astype(p_BKV.dtype))
        return real(p_BKV, draft_BK, num_draft_B, draft_q, keys_B2, start_B, bonus_B, dtype)

    return [(verification, "_decide", decide)]


@_mutant("nonstrict_accept", "u * q(d) <= p(d): accepts p(d) = 0 at u = 0")
def _nonstrict_accept() -> list[Patch]:
    return [(verification, "_accepts", lambda u, q_d, p_d: u * q_d <= p_d)]


# ---- the drafting (jaxspec.decoding.speculative) ------------------------------------------


@_mutant("f16_sampled_unrounded", "drafted from the float32 q, the float16 q sent")
def _f16_sampled_unrounded() -> list[Patch]:
    real = speculative.draft_q_for

    def draft_q_for(logits_BV, sampling, u_B, encoding, sparse_k, q_dtype="float32", counts=None):
        _, sent = real(logits_BV, sampling, u_B, encoding, sparse_k, q_dtype, counts)
        d, _ = real(logits_BV, sampling, u_B, encoding, sparse_k, "float32", counts)
        return d, sent

    return [(speculative, "draft_q_for", draft_q_for)]


def _sending(other_q: Callable) -> list[Patch]:
    """A full q drafted as built, but `other_q(logits, sampling, counts)` sent in its place."""
    real = speculative.draft_q_for

    def draft_q_for(logits_BV, sampling, u_B, encoding, sparse_k, q_dtype="float32", counts=None):
        d, q = real(logits_BV, sampling, u_B, encoding, sparse_k, q_dtype, counts)
        if encoding != "full":
            return d, q
        sent = other_q(logits_BV, sampling, counts)
        return d, ((sent, q[1]) if q_dtype == "float16" else sent)

    return [(speculative, "draft_q_for", draft_q_for)]


@_mutant("warp_p_not_q", "drafted from the warped q, the unwarped q sent")
def _warp_p_not_q() -> list[Patch]:
    return _sending(lambda logits, sampling, counts: jax.nn.softmax(logits, axis=-1))


@_mutant("options_p_not_q", "drafted with logit bias / min-p, q sent without them")
def _options_p_not_q() -> list[Patch]:
    return _sending(lambda logits, sampling, counts: warp(logits, sampling, counts, options=False))


# ---- the penalties' counts ----------------------------------------------------------------


@_mutant("draft_counts_stale", "a draft's penalties forget the block's earlier drafts")
def _draft_counts_stale() -> list[Patch]:
    return [(speculative, "_seen", lambda counts, d_B, live_B: counts)]


@_mutant("counts_not_rolled_back", "the co-located counts keep a rejected block's drafts")
def _counts_not_rolled_back() -> list[Patch]:
    real = speculative.verify_block
    block: dict[str, Any] = {}  # the round's drafts, noted as the rule is traced

    def verify_block(draft_tokens, num_draft, *args, **kwargs):
        block["drafts"], block["num_draft"] = draft_tokens, num_draft
        return real(draft_tokens, num_draft, *args, **kwargs)

    def committed(counts, vr, cnt_B):
        fixed = jnp.take_along_axis(vr.tokens, vr.num_accepted[:, None], axis=1)
        extra = (cnt_B > vr.num_accepted).astype(jnp.int32)
        return counts.add(block["drafts"], block["num_draft"]).add(fixed, extra)

    return [(speculative, "verify_block", verify_block), (speculative, "_committed", committed)]


@_mutant("verifier_counts_not_rolled_back", "the verifier's slot counts keep rejected drafts")
def _verifier_counts_not_rolled_back() -> list[Patch]:
    from verify import counts as slot_counts
    from verify.scheduler import Scheduler

    real = Scheduler._commit

    def _commit(self, s, b, res, i):
        r = real(self, s, b, res, i)
        rejected = list(b.tokens)[int(res["num_accepted"][i]) :]
        if s.penalized and rejected:
            tokens = jnp.asarray(slot_counts.padded(rejected))[None]
            self.counts = slot_counts.commit(self.counts, jnp.asarray([s.slot]), tokens)
        return r

    return [(Scheduler, "_commit", _commit)]


# ---- using them ---------------------------------------------------------------------------


def replacement(name: str) -> Callable:
    """The wrong function of a one-function mutant, to call directly (no patching)."""
    ((_, _, fn),) = MUTANTS[name].patches()
    return fn


@contextlib.contextmanager
def injected(name: str) -> Iterator[Mutant]:
    """Run the body with mutant `name` in place (module doc); unknown names: KeyError."""
    mutant = MUTANTS[name]
    if trace_cache.directory() is not None:
        raise RuntimeError("kept traces are on: a program traced with a mutant would be kept")
    patches = mutant.patches()
    ran: set[str] = set()

    def noting(fn: Callable, attr: str) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            ran.add(attr)
            return fn(*args, **kwargs)

        return run

    jax.clear_caches()
    try:
        with pytest.MonkeyPatch.context() as mp:
            for owner, attr, fn in patches:
                mp.setattr(owner, attr, noting(fn, attr))  # (raises if the name is gone)
            yield mutant
    finally:
        jax.clear_caches()
    idle = [attr for _, attr, _ in patches if attr not in ran]
    assert not idle, f"mutant {name}: {idle} never ran (the test ran the code as built)"


def mutated(
    target: Model,
    draft: Model,
    prompt: list[int],
    rows: int,
    new_tokens: int,
    mutant: str,
    *,
    mode: str = "sync",
    gamma: int = 2,
    encoding: str = "full",
    **sampling,
):
    """`[rows, new_tokens]` tokens (-1 padded) and the stats of `rows` copies of `prompt`
    decoded speculatively under `mutant`, seed 0 (what `jaxspec.generate` would give with
    the same keywords, were the code right), through `jaxspec.decoding.generate.decode`."""
    params = SamplingParams.make(rows, **sampling, vocab_size=target.config.vocab_size)
    with injected(mutant):
        return decode(
            target, [list(prompt)] * rows, new_tokens, params, session_keys(0, rows),
            target.config.eos_token_ids, draft=draft,
            spec=DraftSpec(gamma=gamma, encoding=encoding), mode=mode, max_batch=rows,
        )  # fmt: skip
