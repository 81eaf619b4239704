"""`python -m edge generate`: draft on this device, verify on a remote verifier;
`python -m edge serve`: the same as an OpenAI-compatible HTTP endpoint (edge.openai_server).

    python -m verify serve --port 50051 &
    python -m edge generate --verifier localhost:50051 --chat "What is a hash table?"
    python -m edge generate --verifier localhost:50051 --pair tiny --prompt "def fib(n):"

The models: `--draft` and `--checkpoint` (the target, whose tokenizer encodes the prompt),
by the rule of every command (`jaxspec_host.pairs.resolve`, as `python -m verify serve` and
`jaxspec demo` choose): neither named, `--pair`'s: SmolLM2-135M-Instruct's own W4A16 copy
drafting for SmolLM2 when it can be had (fetched and built once, said on stderr with the
cache directory), else the shipped tiny pair, said in one line; one named alone goes with
its own pair's other half (SmolLM2's, else the tiny pair's).

The draft model (quantized W4A16 as on a device) proposes `--gamma` tokens per block
(`--gamma 0`: speculation off, nothing drafts: the verifier decodes, one token per round; a
`--draft` with it is refused); the verifier's answers are the output, distributed exactly as
the target's. `--q-dtype float16` sends q (`--encoding full` or `sparse`) in half the bytes:
the draft is sampled from the float16-rounded q, so verification stays exact. With
`--resume-timeout-s`, a verifier restart is survived without a lost or repeated token; with
several verifiers (`--verifier a:50051,b:50051`) the session moves to another replica
instead.

Before it loads the draft model (tens of seconds), it checks every flag (exit status 2) and
asks the verifier for its Stats (reachable, token accepted, serving): an unavailable verifier
is retried for `--resume-timeout-s`, saying so on stderr, then reported (exit status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import sys
from collections.abc import AsyncIterator, Sequence

from edge.adaptive import AdaptiveGamma
from edge.client import (
    WARMING_WAIT_S,
    GrpcEndpoint,
    at_most_every,
    channel_target,
    check_verifier,
    retry_notice,
)
from edge.drafter import Drafter, load_drafter
from edge.openai_server import serve_backend
from edge.session import SessionTrace, run_session
from edge.warmup import compile_drafter
from jaxspec.ckpts.checkpoint import generation_defaults, load, load_tokenizer
from jaxspec.nn.model import Model
from jaxspec.nn.text import decode_text
from jaxspec.protocol import DraftSpec, SessionConfig, Unavailable, VerifierError
from jaxspec_host.flags.client import (
    add_edge_client_flags,
    add_edge_session_flags,
    refused_line,
    token_from_args,
)
from jaxspec_host.flags.command import (
    add_max_new_tokens,
    command_parser,
    interrupted,
    parse_command_line,
    refuse_shadowed_package,
    use_compilation_cache,
)
from jaxspec_host.flags.drafting import check_args, refuse_draft_without_speculation
from jaxspec_host.flags.http import add_serve_flags, check_serve_args
from jaxspec_host.flags.models import add_prompt_flags, prompt_from_args
from jaxspec_host.flags.sampling import add_penalty_flags, add_sampling_flags, sampling_for_model
from jaxspec_host.pairs import TINY, resolve
from jaxspec_host.preflight import refuse_other_vocabularies, refuse_pair_with_models
from jaxspec_host.worker import exit_if_abandoned, in_thread


def build_parser() -> argparse.ArgumentParser:
    p, sub = command_parser("python -m edge", "the jaxspec edge client")
    g = sub.add_parser("generate", help="generate against a verifier service")
    add_edge_client_flags(g)
    add_prompt_flags(g)
    add_max_new_tokens(g, 64)
    add_sampling_flags(g, from_model=True)
    add_penalty_flags(g)
    add_edge_session_flags(g)
    s = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP endpoint drafting here, verifying on the verifier"
    )
    add_edge_client_flags(s)
    add_serve_flags(s)
    add_edge_session_flags(s)
    return p


def _check(args: argparse.Namespace) -> DraftSpec:
    """Every flag, before anything connects or loads; the `DraftSpec` (`ValueError`)."""
    spec = check_args(args)
    refuse_draft_without_speculation(args)
    channel_target(args.verifier)  # a malformed address or fleet list: ValueError
    if not args.timeout_s > 0:
        raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
    if not args.resume_timeout_s >= 0:
        raise ValueError(f"--resume-timeout-s must be >= 0, got {args.resume_timeout_s}")
    return spec


def resolve_models(args: argparse.Namespace, spec: DraftSpec, command: str) -> None:
    """Fill `args.checkpoint` and `args.draft` (None with --gamma 0) by the one rule
    (`jaxspec_host.pairs.resolve`): neither named, `--pair`'s models (SmolLM2's W4A16 copy
    for SmolLM2, fetched and built once and said on stderr, else the tiny pair, its fallback
    said in one line); one named alone, its own pair's other half. Idempotent."""
    say = functools.partial(_say, command=command)
    refuse_pair_with_models(args.pair, args.checkpoint, args.draft)
    pair = resolve(args.checkpoint, args.draft, args.pair, drafts=spec.speculative, say=say)
    args.checkpoint, args.draft = pair.target, pair.draft


def _load_models(args: argparse.Namespace, spec: DraftSpec) -> tuple[Drafter | None, Model]:
    """The drafter (None with --gamma 0) and the model whose tokenizer encodes prompts and
    decodes answers: the draft's, with the target's tokenizer (`--checkpoint`, the
    verifier's) when it is another model."""
    if spec.speculative:
        drafter = load_drafter(args.draft, args.quantize, spec)
        text_model = drafter.model
    else:  # --gamma 0, speculation off: nothing drafts; only the target's tokenizer is
        # used, on the tiny draft (loaded in a second) rather than the whole target
        drafter, text_model = None, load(TINY[1])
    if args.checkpoint != args.draft:
        tok = load_tokenizer(args.checkpoint)
        text_model = dataclasses.replace(text_model, tokenizer=tok, name=args.checkpoint)
    return drafter, text_model


@contextlib.asynccontextmanager
async def _connected(
    args: argparse.Namespace, spec: DraftSpec
) -> AsyncIterator[tuple[GrpcEndpoint, Drafter | None, Model]]:
    """The verifier's channel, asked for its Stats first (seconds; an unavailable verifier
    retried for --resume-timeout-s, said on stderr), then the models resolved and loaded
    (tens of seconds; in threads a Ctrl-C does not wait for): (endpoint, drafter, the model
    that encodes prompts and decodes answers, `_load_models`)."""
    say = functools.partial(_say, command=args.command)
    async with GrpcEndpoint(
        args.verifier,
        token=token_from_args(args),
        tls=args.tls,
        tls_ca=args.tls_ca,
        timeout_s=args.timeout_s,
    ) as ep:
        stats = await check_verifier(
            ep, retry_s=args.resume_timeout_s, on_retry=say, on_wait=at_most_every(say),
            warming_s=WARMING_WAIT_S,
        )  # fmt: skip
        await in_thread(resolve_models, args, spec, args.command)
        refuse_other_vocabularies(  # read cheaply, before anything loads
            {"target": args.checkpoint, "draft": args.draft,
             f"the verifier at {args.verifier}": stats.get("vocab_size")}
        )  # fmt: skip
        drafter, text_model = await in_thread(_load_models, args, spec)
        if drafter is not None:  # one not read cheaply before (built on first use): now
            sizes = {
                "draft": drafter.model.config.vocab_size,
                "the verifier": stats.get("vocab_size"),
            }
            refuse_other_vocabularies(sizes)
        yield ep, drafter, text_model


async def _serve(args: argparse.Namespace, spec: DraftSpec) -> int:
    """`python -m edge serve`: the OpenAI-compatible endpoint, every request a session on
    the verifier (edge.openai_server)."""
    async with _connected(args, spec) as (ep, drafter, text_model):
        # what the drafter can hold (gamma 0: no drafter; the verifier's --max-len decides)
        room = text_model.config.max_position_embeddings if drafter else None
        await serve_backend(args, ep, drafter, text_model, spec, max_context=room)
    return 0


def _lengths(chosen: list[int]) -> str:
    """`4x3, 8x12`: how many blocks of each length an adaptive session sent."""
    return ", ".join(f"{g}x{chosen.count(g)}" for g in sorted(set(chosen)))


def _say(text: str, command: str = "generate") -> None:
    print(f"python -m edge {command}: {text}", file=sys.stderr, flush=True)


async def _generate(args: argparse.Namespace, spec: DraftSpec) -> int:
    async with _connected(args, spec) as (ep, drafter, text_model):
        prompt, echo = prompt_from_args(text_model, args)
        # --chat: the target's recommended sampling, where no flag says
        chat = generation_defaults(args.checkpoint) if args.chat is not None else {}
        sampling, said = sampling_for_model(args, chat)
        if said:
            _say(f"{said}; --temperature/--top-p/--top-k override")
        config = SessionConfig(
            prompt=prompt,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling,
            seed=args.seed,
            mode=args.mode,
            draft=spec,
        )

        def on_retry(error: Unavailable, retry_s: float) -> None:
            _say(retry_notice(args.verifier, error, retry_s))

        if drafter is not None:  # its steps compile in a thread a Ctrl-C does not wait for
            await in_thread(compile_drafter, drafter, [config], args.depth)

        # --gamma auto: each block's length from what this session measures (edge.adaptive).
        policy = AdaptiveGamma(spec.gamma, args.mode, args.depth) if spec.adaptive else None
        trace = await run_session(
            ep,
            drafter,
            config,
            depth=args.depth,
            resume_timeout_s=args.resume_timeout_s,
            on_retry=on_retry,
            block_len=policy,
        )
    print(echo + decode_text(text_model, trace.tokens))
    print(
        f"[{len(trace.tokens)} tokens, {trace.tokens_per_s:.1f} tok/s, {_acceptance(trace)}, "
        f"{trace.figures.rounds} rounds, {trace.stale} stale, "
        f"{trace.resumes} resumes; {args.mode} gamma={args.gamma} {args.encoding}"
        + (" float16 q" if spec.f16 else "")
        + (f", blocks of {_lengths(policy.chosen)}" if policy is not None else "")
        + "]",
        file=sys.stderr,
    )
    return 0


def _acceptance(trace: SessionTrace) -> str:
    """The verifier's acceptance figures for the session, in words: the rate and, per draft
    position, the fraction of blocks that got that far ("speculation off" for gamma 0)."""
    f = trace.figures
    if not f.num_drafts:
        return "speculation off" if not f.accepted_per_position else "no drafts verified"
    per_pos = " ".join(f"{rate:.2f}" for rate in f.per_position_acceptance)
    return f"acceptance rate {f.acceptance_rate:.2f} (per position {per_pos})"


def main(argv: Sequence[str] | None = None) -> int:
    # before parsing: --help would work, then fail
    shadowed = refuse_shadowed_package("python -m edge")
    if shadowed is not None:
        return shadowed
    parser = build_parser()
    args = parse_command_line(parser, argv)
    try:
        spec = _check(args)
        if args.command == "serve":
            check_serve_args(args)
    except (ValueError, OSError) as e:  # a bad flag is a usage error (exit 2)
        parser.error(str(e))
    use_compilation_cache(args)  # the draft's compiled steps, for the next run
    run = _serve if args.command == "serve" else _generate
    try:
        return asyncio.run(run(args, spec))
    except VerifierError as e:
        print(refused_line(f"python -m edge {args.command}", e), file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        print(f"python -m edge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a model loading in a worker thread is not waited for
        return exit_if_abandoned(interrupted(f"python -m edge {args.command}"))


if __name__ == "__main__":
    sys.exit(main())
