"""`jaxspec serve`: the OpenAI-compatible endpoint with the target and the draft in this one
process (co-located; no verifier service).

    jaxspec serve --checkpoint smollm2 --draft smollm2-w4a16 --port 8000

The same app as `python -m edge serve` (edge.openai_server), whose backend is an in-process
`LocalVerifier` instead of a gRPC channel: every request is its own session in the verifier's
scheduler, batched with the others, and gives the tokens `python -m edge serve` gives against
a verifier serving the same target with the same flags. The models are chosen as every
command chooses them (`jaxspec_host.pairs.resolve`), and the verifier's sizes default as
`python -m verify serve`'s do (`SchedulerConfig`'s).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import jaxspec
from edge.drafter import load_drafter
from edge.openai_server import serve_backend
from jaxspec_host.flags import (
    add_cache_flag,
    add_model_flags,
    add_serve_flags,
    add_speculation_flags,
    add_verifier_limits,
    check_args,
    check_serve_args,
    refuse_draft_without_speculation,
    use_compilation_cache,
)
from jaxspec_host.pairs import resolve
from jaxspec_host.preflight import (
    refuse_other_vocabularies,
    refuse_pair_with_models,
    refuse_sessionless,
    refuse_unaffordable_cache,
)
from verify import LocalVerifier, SchedulerConfig
from verify.serve import scheduler_config_from_args

# Co-located, the drafts run on the cores the verifier steps on: measured on a 2-core machine
# (docs/service.md), speculation paid with one request running and cost from two on.
PLAIN_PAST = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The target, the draft, the verifier's sizes and the HTTP flags (`add_serve_flags`)."""
    add_model_flags(p, "colocated")
    add_serve_flags(p, plain_past=PLAIN_PAST)
    add_speculation_flags(p)
    add_verifier_limits(p, SchedulerConfig, colocated=True)
    add_cache_flag(p)


def _config(args: argparse.Namespace, spec: jaxspec.DraftSpec) -> SchedulerConfig:
    """The in-process verifier's scheduler: the flags' sizes, blocks as long as `spec`'s."""
    return scheduler_config_from_args(args, max_gamma=max(spec.gamma, 1))


async def _serve(args: argparse.Namespace, spec: jaxspec.DraftSpec) -> int:
    target = jaxspec.load(args.checkpoint)
    drafter = load_drafter(args.draft, args.quantize, spec) if spec.speculative else None
    if drafter is not None:  # one not read cheaply before (built on first use): now
        vocab = drafter.model.config.vocab_size
        refuse_other_vocabularies({"target": target.config.vocab_size, "draft": vocab})
    config = _config(args, spec)
    verifier = LocalVerifier(target, config)
    reserved = config.max_gamma + 1  # a slot's positions past the answer (a draft block)
    try:
        await serve_backend(
            args, verifier, drafter, target, spec,
            max_context=args.max_len - reserved, reserved=reserved,
        )  # fmt: skip
    finally:
        await verifier.aclose()
    return 0


def main(args: argparse.Namespace) -> int:
    """Check every flag, load the pair, serve until SIGINT/SIGTERM."""
    spec = check_args(args)
    refuse_draft_without_speculation(args)  # --gamma 0: plain decoding, no draft
    check_serve_args(args)
    config = _config(args, spec)  # ValueError early
    refuse_sessionless(config.max_len, config.max_gamma)
    refuse_pair_with_models(args.pair, args.checkpoint, args.draft)
    say = lambda text: print(f"jaxspec serve: {text}", file=sys.stderr, flush=True)  # noqa: E731
    pair = resolve(args.checkpoint, args.draft, args.pair, drafts=spec.speculative, say=say)
    args.checkpoint, args.draft = pair.target, pair.draft
    refuse_other_vocabularies({"target": args.checkpoint, "draft": args.draft})
    refuse_unaffordable_cache(args.checkpoint, config.max_sessions, config.max_len)
    use_compilation_cache(args)
    return asyncio.run(_serve(args, spec))
