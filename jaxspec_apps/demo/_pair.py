"""Which target/draft pair the demo runs (`jaxspec_host.pairs` decides, as for `python -m
verify serve` and `python -m edge generate`): SmolLM2-135M-Instruct with its own W4A16 copy
as the draft when the target can be had, else the shipped tiny pair, said in one line.

    --pair auto|smollm2|gemma3|tiny   as in jaxspec_host.pairs (gemma3: completions)
    --checkpoint / --draft     given explicitly: used as given; one named alone goes with
                               its own pair's other half (SmolLM2's, else the tiny pair's)

With `--verifier` (a verifier that is already running, serving whatever it serves) `auto`
means the tiny draft, as before: `--pair smollm2` (or `--draft smollm2-w4a16`) for a verifier
serving SmolLM2. With `--gamma 0` nothing drafts: no draft is chosen or built.
"""

from __future__ import annotations

import argparse

from jaxspec.ckpts.checkpoint import CheckpointError  # noqa: F401  (tests raise it through here)
from jaxspec_host import hub, pairs
from jaxspec_host.pairs import PAIRS, REAL_DRAFTS, TINY  # noqa: F401  (the demo's names)


def _drafts(args: argparse.Namespace) -> bool:
    """Whether the demo drafts at all (`--gamma 0`: speculation off, no draft)."""
    return getattr(args, "gamma", 1) != 0


def needs_fetch(args: argparse.Namespace) -> bool:
    """Whether `resolve_pair(args)` will fetch or build something (minutes, worth a progress
    bar) rather than find the real pair in the cache."""
    if getattr(args, "chat", None) is not None or args.checkpoint or args.draft:
        return False
    if _choice(args) == "tiny":
        return False
    return not pairs.is_cached(draft=_drafts(args), choice=_choice(args))


def _choice(args: argparse.Namespace) -> str:
    """`--pair`, but `auto` with `--verifier` is the tiny pair (what a running verifier
    serves is not known here)."""
    return "tiny" if args.pair == "auto" and args.verifier is not None else args.pair


def resolve_pair(args: argparse.Namespace, progress: hub.Progress | None = None) -> str | None:
    """Fill `args.checkpoint`, `args.draft` (None with `--gamma 0`) and `args.chat` (chat
    prompts for the real pair) by every command's rule (`jaxspec_host.pairs.resolve`);
    return the one line to show when `auto` fell back to the tiny pair (None otherwise).
    Idempotent. `progress(stage, done, total)` hears a fetch's bytes and a conversion's and
    quantization's steps. Raises ValueError for `--pair smollm2` when the real pair cannot
    run."""
    if getattr(args, "chat", None) is not None:
        return None
    named = args.checkpoint is not None or args.draft is not None
    pair = pairs.resolve(
        args.checkpoint, args.draft, _choice(args), drafts=_drafts(args), progress=progress
    )
    args.checkpoint, args.draft = pair.target, pair.draft
    real = pairs.real_pair_of(args.checkpoint) or pairs.real_pair_of(args.draft or "")
    args.chat = pair.chat or bool(named and real and real.chat)
    args.completion = not args.chat and real is not None  # a real base model: Gemma
    if real is not None and not getattr(args, "q_dtype", None):
        # q over a real vocabulary (49,152 or 262,144 entries): float16 halves the 196 KB or
        # 1 MB per draft, exactly.
        args.q_dtype = "float16"
    return pair.notice
