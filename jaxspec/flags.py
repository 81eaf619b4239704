"""The sampling and drafting flags every command shares, spelled once (stdlib argparse only).

    p = argparse.ArgumentParser()
    add_sampling_flags(p, temperature=0.7, top_k=None, top_p=None)  # None: no such flag
    add_draft_flags(p, mode="pipelined")
    args = p.parse_args()
    spec = draft_spec_from_args(args)                               # a validated DraftSpec

Each command keeps its own defaults (passed here) and leaves out the flags it has no use
for; the names, types, choices and help texts are the same everywhere. The destinations are
`temperature`, `top_k`, `top_p`, `seed`, `gamma`, `mode`, `encoding`, `sparse_k`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from jaxspec.protocol import ENCODINGS, MODES, DraftSpec

SAMPLING_HELP = {
    "temperature": "sampling temperature; 0 = greedy (default %(default)s)",
    "top_k": "keep the k most likely tokens; 0 = off (default %(default)s)",
    "top_p": "keep the smallest set of tokens with this much mass; 1 = off (default %(default)s)",
    "seed": "session seed: every draw is keyed by (seed, position) (default %(default)s)",
}
DRAFT_HELP = {
    "gamma": "drafts per block (default %(default)s)",
    "mode": "sync: one block, then wait for its verdict (a bonus token after a fully accepted "
    "block); pipelined: draft on while blocks are in flight (default %(default)s)",
    "encoding": "how the draft q travels: full distribution, sparse top-k, or onehot "
    "(token ids only, greedy drafts) (default %(default)s)",
    "sparse_k": "columns of q per draft with --encoding sparse (default %(default)s)",
}


def _add(
    parser: argparse.ArgumentParser,
    flags: Mapping[str, tuple[object, type, tuple[str, ...] | None]],
    helps: Mapping[str, str],
    overrides: Mapping[str, str] | None,
) -> None:
    """Add `--name` for every flag whose default is not None."""
    unknown = set(overrides or ()) - set(helps)
    if unknown:
        raise ValueError(f"no such flag to describe: {sorted(unknown)}")
    for dest, (default, type_, choices) in flags.items():
        if default is None:
            continue
        parser.add_argument(
            "--" + dest.replace("_", "-"),
            type=type_,
            default=default,
            choices=choices,
            help={**helps, **(overrides or {})}[dest],
        )


def add_sampling_flags(
    parser: argparse.ArgumentParser,
    *,
    temperature: float | None = 1.0,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    seed: int | None = 0,
    helps: Mapping[str, str] | None = None,
) -> None:
    """Add `--temperature --top-k --top-p --seed` with these defaults; a flag whose default is
    None is left out. `helps` replaces the help text of some (by destination name)."""
    flags = {
        "temperature": (temperature, float, None),
        "top_k": (top_k, int, None),
        "top_p": (top_p, float, None),
        "seed": (seed, int, None),
    }
    _add(parser, flags, SAMPLING_HELP, helps)


def add_draft_flags(
    parser: argparse.ArgumentParser,
    *,
    gamma: int | None = 4,
    mode: str | None = "sync",
    encoding: str | None = "full",
    sparse_k: int | None = 8,
    helps: Mapping[str, str] | None = None,
) -> None:
    """Add `--gamma --mode --encoding --sparse-k` with these defaults (mode and encoding
    limited to `MODES` and `ENCODINGS`); a flag whose default is None is left out."""
    flags = {
        "gamma": (gamma, int, None),
        "mode": (mode, str, MODES),
        "encoding": (encoding, str, ENCODINGS),
        "sparse_k": (sparse_k, int, None),
    }
    _add(parser, flags, DRAFT_HELP, helps)


def draft_spec_from_args(args: argparse.Namespace) -> DraftSpec:
    """The `DraftSpec` of parsed draft flags (a flag a command left out takes DraftSpec's
    default). Raises `InvalidArgument` (a `ValueError`) for values out of range."""
    given = {f: getattr(args, f) for f in ("gamma", "encoding", "sparse_k") if hasattr(args, f)}
    return DraftSpec(**given)
