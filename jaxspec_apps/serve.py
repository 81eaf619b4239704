"""`jaxspec serve`: the OpenAI-compatible endpoint with the target and the draft in this one
process (co-located; no verifier service).

    jaxspec serve --checkpoint smollm2 --draft smollm2-w4a16 --port 8000

The same app as `python -m edge serve` (edge.openai_server), whose backend is an in-process
`LocalVerifier` instead of a gRPC channel: every request is its own session in the verifier's
scheduler, batched with the others, and gives the tokens `python -m edge serve` gives against
a verifier serving the same target with the same flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import jaxspec
from edge.drafter import load_drafter
from edge.openai_server import (
    Backend,
    add_serve_flags,
    check_serve_args,
    create_app,
    serve_app,
    with_chat_template,
)
from jaxspec_host.flags import (
    add_cache_flag,
    add_draft_flags,
    check_args,
    refuse_draft_without_speculation,
    use_compilation_cache,
)
from jaxspec_host.pairs import TINY, add_pair_flag, choose_saying
from verify import LocalVerifier, SchedulerConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The target, the draft, the verifier's sizes and the HTTP flags (`add_serve_flags`)."""
    p.add_argument(
        "--checkpoint",
        default=None,
        help="the target: HF checkpoint dir, .gguf file, or a name (default: --pair's)",
    )
    p.add_argument("--draft", default=None, help="draft checkpoint or name (default: --pair's)")
    add_pair_flag(p)
    p.add_argument(
        "--quantize",
        default="w4a16",
        choices=["w4a16", "w8a16", "none"],
        help="the draft's weights (as `python -m edge serve` holds them)",
    )
    add_serve_flags(p)
    add_draft_flags(p, mode="pipelined", q_dtype="float32", auto_gamma=True)
    p.add_argument("--depth", type=int, default=2, help="blocks in flight when pipelined")
    p.add_argument("--max-sessions", type=int, default=16, help="requests served at once")
    p.add_argument(
        "--max-len", type=int, default=512, help="positions per request (prompt + answer)"
    )
    add_cache_flag(p)


async def _serve(args: argparse.Namespace, spec: jaxspec.DraftSpec) -> int:
    target = jaxspec.load(args.checkpoint)
    drafter = load_drafter(args.draft, args.quantize, spec) if spec.speculative else None
    config = SchedulerConfig(
        max_sessions=args.max_sessions, max_len=args.max_len, max_gamma=max(spec.gamma, 1)
    )
    verifier = LocalVerifier(target, config)
    try:
        backend = Backend(
            endpoint=verifier,
            drafter=drafter,
            text_model=with_chat_template(target, args.chat_template_text),
            model_id=args.served_model_name or args.checkpoint,
            draft=spec,
            mode=args.mode,
            depth=args.depth,
            max_tokens=args.max_new_tokens,
            chat_defaults=jaxspec.generation_defaults(args.checkpoint),
            max_context=args.max_len,
        )
        app = create_app(backend, api_key=args.api_key, limits=args.http_limits)
        await serve_app(app, args.host, args.port, backend.model_id, args.http_limits)
    finally:
        await verifier.aclose()
    return 0


def _fill_pair(args: argparse.Namespace, spec: jaxspec.DraftSpec) -> None:
    """Models not named come from `--pair` (SmolLM2 and its W4A16 copy, or the tiny pair),
    as for `python -m verify serve` and `python -m edge serve`; a draft named alone goes
    with the tiny target, as before."""
    if args.checkpoint is None and args.draft is None:
        say = lambda text: print(f"jaxspec serve: {text}", file=sys.stderr, flush=True)  # noqa: E731
        pair = choose_saying(args.pair, say, draft=spec.speculative)
        args.checkpoint, args.draft = pair.target, pair.draft
    args.checkpoint = args.checkpoint or TINY[0]
    args.draft = args.draft or TINY[1]


def main(args: argparse.Namespace) -> int:
    """Check every flag, load the pair, serve until SIGINT/SIGTERM."""
    spec = check_args(args)
    refuse_draft_without_speculation(args)  # --gamma 0: plain decoding, no draft
    check_serve_args(args)
    _fill_pair(args, spec)
    SchedulerConfig(max_sessions=args.max_sessions, max_len=args.max_len)  # ValueError early
    use_compilation_cache(args)
    return asyncio.run(_serve(args, spec))
