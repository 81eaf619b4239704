"""The drafting flags (`--gamma` N or auto, `--longest-block --mode --encoding --sparse-k
--q-dtype --depth`), the `DraftSpec` made of them, and `check_args`, which validates every
shared flag of a command before anything loads.

    add_draft_flags(p, mode="pipelined")
    spec = check_args(args)          # every shared flag validated, a DraftSpec; nothing loaded
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from jaxspec.decoding.sampling import check_seed
from jaxspec.protocol import ENCODINGS, MODES, Q_DTYPES, DraftSpec
from jaxspec_host.flags.command import add_flags
from jaxspec_host.flags.sampling import sampling_from_args

AUTO = "auto"  # --gamma auto: the edge picks each block's length (DraftSpec.adaptive)
DEFAULT_LONGEST_BLOCK = 8  # the longest block of --gamma auto unless --longest-block says
DRAFT_HELP = {
    "gamma": "drafts per block (default %(default)s)",
    "gamma_auto": "drafts per block, or 'auto': the edge picks each block's length in "
    "[1, --longest-block] as it goes (default %(default)s)",
    "longest_block": "with --gamma auto: the longest block (default %(default)s)",
    "mode": "sync: one block, then wait for its verdict (a bonus token after a fully accepted "
    "block); pipelined: draft on while blocks are in flight (default %(default)s)",
    "encoding": "how the draft q travels: full distribution, sparse top-k, or onehot "
    "(token ids only, greedy drafts) (default %(default)s)",
    "sparse_k": "columns of q per draft with --encoding sparse (default %(default)s)",
    "q_dtype": "how q travels with --encoding full or sparse: float32, or float16 (half the "
    "bytes; the edge samples from the rounded q, so the rule stays exact) "
    "(default %(default)s)",
}


def gamma_or_auto(text: str) -> int | str:
    """`--gamma`'s type where a command can choose block lengths: an int, or "auto"."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or {AUTO!r}, got {text!r}") from None


def add_draft_flags(
    parser: argparse.ArgumentParser,
    *,
    gamma: int | None = 4,
    mode: str | None = "sync",
    encoding: str | None = "full",
    sparse_k: int | None = 8,
    q_dtype: str | None = None,
    auto_gamma: bool = False,
    helps: Mapping[str, str] | None = None,
) -> None:
    """Add `--gamma --mode --encoding --sparse-k` (and `--q-dtype` when given a default: the
    commands that send q over the wire) with these defaults (mode, encoding and q dtype
    limited to `MODES`, `ENCODINGS` and `Q_DTYPES`); a flag whose default is None is left out.

    `auto_gamma`: the command can let the edge choose each block's length, so `--gamma`
    also takes "auto" (`DraftSpec(gamma=--longest-block, adaptive=True)`) and `--longest-block` is
    added. Commands that run a fixed block length (co-located decoding, benchmarks) leave it
    off, and "auto" is a usage error there."""
    flags = {
        "gamma": (gamma, gamma_or_auto if auto_gamma else int, None),
        "mode": (mode, str, MODES),
        "encoding": (encoding, str, ENCODINGS),
        "sparse_k": (sparse_k, int, None),
        "q_dtype": (q_dtype, str, Q_DTYPES),
    }
    helps = dict(helps or {})
    gamma_auto_help = helps.pop("gamma_auto", DRAFT_HELP["gamma_auto"])
    if auto_gamma and gamma is not None:
        helps.setdefault("gamma", gamma_auto_help)
        flags["longest_block"] = (DEFAULT_LONGEST_BLOCK, int, None)
    add_flags(parser, flags, DRAFT_HELP, helps)


def draft_spec_from_args(args: argparse.Namespace) -> DraftSpec:
    """The `DraftSpec` of parsed draft flags (a flag a command left out takes DraftSpec's
    default); `--gamma auto` is `DraftSpec(gamma=--longest-block (default 8), adaptive=True)`.
    Raises `InvalidArgument` (a `ValueError`) for values out of range."""
    names = ("gamma", "encoding", "sparse_k", "q_dtype")
    given = {f: getattr(args, f) for f in names if hasattr(args, f)}
    if given.get("gamma") == AUTO:
        longest = getattr(args, "longest_block", None)
        given["gamma"] = DEFAULT_LONGEST_BLOCK if longest is None else longest
        given["adaptive"] = True
    return DraftSpec(**given)


def check_args(args: argparse.Namespace) -> DraftSpec:
    """Validate every shared flag `args` has, before anything loads: the sampling values
    (`sampling_from_args`: making the library's `SamplingSettings`, kept as `args.sampling`;
    `from_model` flags left unset are the model's to give, checked when `sampling_for_model`
    gets them), the seed, the draft flags (`DraftSpec`) and, where the command has them,
    `--max-new-tokens` and `--depth`. Returns the `DraftSpec`; raises `ValueError`
    (`InvalidArgument` for the sampling and draft flags) naming the flag."""
    args.sampling = sampling_from_args(args)
    check_seed(getattr(args, "seed", 0), "--seed")
    mode = getattr(args, "mode", MODES[0])
    if mode not in MODES:  # argparse's choices already refuse it; kept for Namespaces built by hand
        raise ValueError(f"--mode must be one of {MODES}, got {mode!r}")
    for dest in ("max_new_tokens", "depth"):
        value = getattr(args, dest, 1)
        if value < 1:
            raise ValueError(f"--{dest.replace('_', '-')} must be >= 1, got {value}")
    return draft_spec_from_args(args)


def refuse_draft_without_speculation(args: argparse.Namespace) -> None:
    """`--gamma 0` means one thing in every command: speculation off, plain target decoding
    (on the edge, empty blocks the verifier answers with one token each). A `--draft` given
    with it would be loaded for nothing, or silently ignored: a ValueError naming both
    flags. Commands whose `--draft` defaults to None call this (None: not given)."""
    draft = getattr(args, "draft", None)
    if getattr(args, "gamma", None) == 0 and draft is not None:
        raise ValueError(
            f"--draft {draft} with --gamma 0: --gamma 0 turns speculation off (plain target "
            "decoding), so nothing drafts; drop --draft, or give --gamma 1 or more"
        )


def add_speculation_flags(
    parser: argparse.ArgumentParser, *, q_dtype: str | None = "float32", encoding: bool = True
) -> None:
    """How an edge speculates (`python -m edge generate` / `serve`, `jaxspec serve`, `jaxspec
    demo`): the draft flags (`add_draft_flags`: `--gamma` N or auto with `--longest-block`,
    `--mode` pipelined by default, `--encoding --sparse-k` unless `encoding` is False,
    `--q-dtype` when given a default) and `--depth`, the blocks in flight."""
    sparse = {} if encoding else {"encoding": None, "sparse_k": None}
    add_draft_flags(parser, mode="pipelined", q_dtype=q_dtype, auto_gamma=True, **sparse)
    parser.add_argument("--depth", type=int, default=2, help="blocks in flight when pipelined")
