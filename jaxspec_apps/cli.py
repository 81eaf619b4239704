"""The `jaxspec` command.

Subcommands:
  generate      decode a prompt with a checkpoint (plain, or speculative with --draft);
                `--checkpoint default --draft default-draft` uses the shipped pair
  init-random   write a random-weight tiny checkpoint (to try the tools without training)
  demo          a live terminal view of edge tenants drafting against a verifier service
  bench         run the benchmark suite; writes BENCHMARKS.md, bench/results.json, plots
                (into a new temporary directory unless --out says where)

Every command checks its arguments before it loads a model (exit status 2 on a bad one).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import jaxspec
from jaxspec.flags import (
    add_cache_flag,
    add_draft_flags,
    add_sampling_flags,
    check_args,
    use_compilation_cache,
)
from jaxspec.testing import write_random_checkpoint
from jaxspec.text import decode_text, encode_prompt
from jaxspec_apps import bench, demo


def _generate(args: argparse.Namespace) -> int:
    check_args(args)  # every flag, before the checkpoints load (tens of seconds)
    use_compilation_cache(args)
    model = jaxspec.load(args.checkpoint)
    draft = jaxspec.load(args.draft) if args.draft else None
    ids = encode_prompt(model, args.prompt)
    out = jaxspec.generate(
        model,
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        draft=draft,
        gamma=args.gamma,
        mode=args.mode,
        encoding=args.encoding,
        sparse_k=args.sparse_k,
    )
    prefix = "" if model.tokenizer is None else args.prompt
    print(prefix + decode_text(model, out.tokens))
    s = out.stats
    spec = ""
    if s.spec is not None:
        spec = (
            f", speculative gamma={args.gamma} {args.mode} {args.encoding}: acceptance rate "
            f"{s.acceptance_rate:.2f}, {s.tokens_per_round:.2f} tokens per round"
        )
    # Compilation (first call of each shape) and generation are timed apart: tok/s is the
    # speed of the generation alone, what a second prompt of these shapes would get.
    print(
        f"[compiled in {s.compile_s:.2f} s; {s.new_tokens} tokens in {s.wall_s:.2f} s, "
        f"{s.tokens_per_s:.1f} tok/s{spec}]",
        file=sys.stderr,
    )
    return 0


def _init_random(args: argparse.Namespace) -> int:

    path = write_random_checkpoint(args.path, seed=args.seed)
    print(f"wrote a random tiny checkpoint to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jaxspec", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="decode a prompt with a checkpoint")
    g.add_argument("--checkpoint", required=True, help="HF checkpoint dir or built-in name")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=64)
    add_sampling_flags(g)
    g.add_argument("--draft", default=None, help="draft checkpoint: speculative decoding")
    add_draft_flags(g, mode="sync")
    add_cache_flag(g)
    g.set_defaults(func=_generate)

    r = sub.add_parser("init-random", help="write a random-weight tiny checkpoint")
    r.add_argument("path")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=_init_random)

    # Larger subcommands live in their own modules: each defines `add_arguments(parser)`
    # and `main(args) -> int`.
    for name, module, help_ in (
        ("demo", demo, "live TUI of edge tenants drafting against a verifier"),
        ("bench", bench, "run the benchmark suite and write the report"),
    ):
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(func=module.main)
        module.add_arguments(sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
