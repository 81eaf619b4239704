"""What the verifier refuses of a block before it queues it (`Scheduler.check`): every check
that needs the block's session (its gamma, epoch, prompt and draft encoding) and the model's
vocabulary. The block's own values were checked as it was made (`jaxspec.protocol`); these
are the ones a block cannot check alone. `MAX_STOP_TOKENS` bounds a session's stop list."""

from __future__ import annotations

import numpy as np

from jaxspec.protocol import DraftBlock, DraftSpec, FailedPrecondition, InvalidArgument
from verify.sessions import Session

# The most stop tokens a session may name (a bound on every list a request carries: the
# prompt and the committed tokens are bounded by max_len already).
MAX_STOP_TOKENS = 64


def check_block(b: DraftBlock, s: Session, vocab: int) -> None:
    """What `Scheduler.check` refuses of a block for its session `s` at this `vocab`:
    `InvalidArgument` (drafts past gamma, a start inside the prompt, q that does not fit the
    session) or `FailedPrecondition` (an epoch the session has not reached)."""
    n, gamma = len(b.tokens), s.config.draft.gamma
    if gamma == 0 and n:
        raise InvalidArgument(f"a gamma-0 session's blocks hold no drafts, got {n}")
    # A block may hold no drafts: an adaptive sync session's pause (edge.adaptive), or a
    # session that stopped drafting (a loaded server: edge.session's `drafts_off`).
    if n > gamma:
        raise InvalidArgument(f"a block holds 0..{gamma} drafts, got {n}")
    if b.epoch > s.epoch:
        raise FailedPrecondition(f"unknown epoch {b.epoch} (current {s.epoch})")
    if b.start < s.prompt_len:
        raise InvalidArgument("a block cannot start inside the prompt")
    if n:  # n == 0, speculation off: the verifier samples the block's one token (no q)
        check_q_layout(s.config.draft, b, vocab)


def check_q_layout(draft: DraftSpec, b: DraftBlock, vocab: int) -> None:
    """What of a block's q needs its session: the session's encoding and q dtype, q's
    width at this vocabulary (or sparse_k), drafts and sparse ids inside the vocabulary.
    q's values were checked once, as the block was made (`DraftBlock`: in-process, or
    `jaxspec.protocol.wire` off the wire), and are not read again here."""
    n = len(b.tokens)
    if any(t < 0 or t >= vocab for t in b.tokens):
        raise InvalidArgument(f"draft token ids must be in [0, {vocab})")
    if draft.encoding == "full":
        if b.q is None or b.q_ids is not None or b.q.shape != (n, vocab):
            raise InvalidArgument(f"full q must have shape ({n}, {vocab})")
    elif draft.encoding == "sparse":
        k = draft.sparse_k
        if b.q is None or b.q_ids is None or b.q.shape != (n, k):
            raise InvalidArgument(f"sparse q and q_ids must have shape ({n}, {k})")
        if np.any((b.q_ids < 0) | (b.q_ids >= vocab)):
            raise InvalidArgument(f"sparse q ids must be in [0, {vocab})")
    elif b.q is not None:
        raise InvalidArgument("onehot blocks carry no q")
    # A float16 session's q is exactly float16 values times one scale per draft (the
    # block proved it as it was made); a float32 session's carries no scale.
    if draft.f16 and b.q_scale is None:
        raise InvalidArgument(f"a float16 session's blocks carry {n} q_scale values")
    if not draft.f16 and b.q_scale is not None:
        raise InvalidArgument("q_scale is for q_dtype float16 sessions (full or sparse)")
