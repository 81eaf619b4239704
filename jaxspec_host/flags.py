"""The sampling and drafting flags every command shares, spelled once (argparse).

    p = argparse.ArgumentParser()
    add_sampling_flags(p, temperature=0.7, top_k=None, top_p=None)  # None: no such flag
    add_draft_flags(p, mode="pipelined")
    args = p.parse_args()
    spec = check_args(args)          # every shared flag validated, a DraftSpec; nothing loaded
    sampling = sampling_from_args(args, model_settings)  # the one SamplingSettings

Each command keeps its own defaults (passed here) and leaves out the flags it has no use
for; the names, types, choices and help texts are the same everywhere. The destinations are
`temperature`, `top_k`, `top_p`, `seed`, `gamma`, `mode`, `encoding`, `sparse_k` (and
`longest_block` where a command takes `--gamma auto`: `args.gamma` is then an int or "auto";
`q_dtype` where a command sends q over the wire).
`sampling_from_args` turns the sampling and penalty flags into the library's one settings
type (`SamplingSettings`, whose construction is the check); `check_args` makes it and the
`DraftSpec` before anything loads, so a bad flag fails in a fraction of a second instead of
after a model has loaded.

The serving commands (`python -m verify serve`, `python -m edge generate` / `serve`, `jaxspec
serve`, `jaxspec demo`) take their shared groups from here too, one function each:
`add_model_flags(parser, role)` (`--checkpoint --draft --pair --quantize`, resolved by
`jaxspec_host.pairs.resolve`), `add_speculation_flags` (the draft flags and `--depth`),
`add_verifier_limits` (`--max-sessions --max-len` and the scheduler's other sizes), and
`is_loopback`, the one rule of which `--host` is reachable from this machine only.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import ipaddress
import os
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from jaxspec.decoding.sampling import check_seed
from jaxspec.nn.model import Model
from jaxspec.nn.text import chat_prompt, encode_prompt
from jaxspec.protocol import (
    ENCODINGS,
    MODES,
    Q_DTYPES,
    DraftSpec,
    SamplingSettings,
    VerifierError,
)
from jaxspec_host.pairs import add_pair_flag
from jaxspec_host.xla_cache import compilation_cache_dir, configure_compilation_cache

SAMPLING_HELP = {
    "temperature": "sampling temperature; 0 = greedy (default %(default)s)",
    "top_k": "keep the k most likely tokens; 0 = off (default %(default)s)",
    "top_p": "keep the smallest set of tokens with this much mass; 1 = off (default %(default)s)",
    "seed": "session seed: every draw is keyed by (seed, position) (default %(default)s)",
    "min_p": "keep tokens at least this fraction as likely as the most likely; 0 = off "
    "(default %(default)s)",
    "logit_bias": "ID:BIAS,... added to those tokens' logits first (greedy too), e.g. "
    "'2:-100' bans token 2; at most 32, each within +-100",
}
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


class HelpFormatter(argparse.HelpFormatter):
    """Every command's help: a flag's default is shown, appended as "(default X)" to a help
    text that does not mention its default already (switches that are off by default and
    defaults of None show none). Pass it as `formatter_class` to every (sub)parser."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.nargs == 0:
            return text
        if action.default is None or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default %(default)s)"


def command_parser(prog: str, description: str) -> tuple[argparse.ArgumentParser, Any]:
    """A command with subcommands (`python -m verify`, `python -m edge`, `jaxspec`): the
    parser and the action whose `add_parser(name, help=...)` adds one, every parser with
    `HelpFormatter`."""
    parser = functools.partial(argparse.ArgumentParser, formatter_class=HelpFormatter)
    p = parser(prog=prog, description=description)
    p.subcommands = p.add_subparsers(dest="command", required=True, parser_class=parser)
    return p, p.subcommands


def parse_command_line(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """`parser.parse_args(argv)`, except that a flag the (sub)command does not know is
    refused by the subcommand that was run, with its usage and the nearest flag it has
    (`jaxspec demo --gama 4`: "did you mean --gamma?"), not by the top-level parser.
    `parser` from `command_parser` (its subcommands known), or any parser."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    subcommands = getattr(parser, "subcommands", None)
    sub = parser
    if subcommands is not None:
        sub = subcommands.choices.get(getattr(args, "command", None), parser)
    known = sorted(set(re.findall(r"--[a-z0-9][a-z0-9-]*", sub.format_usage())))
    words = [f"unrecognized arguments: {' '.join(extra)}"]
    for arg in extra:
        if arg.startswith("--"):
            near = difflib.get_close_matches(arg.split("=")[0], known, n=1, cutoff=0.6)
            words += [f"did you mean {near[0]}?"] if near else []
    sub.error("; ".join(words))


def add_max_new_tokens(
    parser: argparse.ArgumentParser, default: int, *, dest: str = "max_new_tokens", what: str = ""
) -> None:
    """`--max-new-tokens N`, the one name of the new-token count in every command."""
    parser.add_argument(
        "--max-new-tokens",
        dest=dest,
        metavar="N",
        type=int,
        default=default,
        help=f"new tokens to generate at most{what} (an answer may end sooner at its end token)",
    )


def shadowing_folder(package: object = None) -> str | None:
    """The folder that stands in for the installed `jaxspec` package, or None when `jaxspec`
    is the real package. A folder named `jaxspec` without `__init__.py` earlier on the path
    (a clone of the repository in the working directory) is imported as an empty namespace
    package; with an editable install its submodules still load, so the failure came late
    (`module 'jaxspec' has no attribute 'load'`, after the server said "listening").
    `package`: the module to look at (default: the imported `jaxspec`)."""
    if package is None:
        package = sys.modules.get("jaxspec") or importlib.import_module("jaxspec")
    if getattr(package, "__file__", None) is not None:
        return None
    folders = list(getattr(package, "__path__", []))
    return str(folders[0]) if folders else "?"


def refuse_shadowed_package(command: str) -> int | None:
    """At a command's start: exit status 2 with one clear line when `shadowing_folder()`
    finds a folder in the way; None when the package is the real one."""
    folder = shadowing_folder()
    if folder is None:
        return None
    print(
        f"{command}: error: the folder {folder} shadows the installed jaxspec package (Python "
        "imports a folder named jaxspec in the working directory before the package; a clone "
        f"of the repository keeps the package in {folder}/jaxspec). Run the command from "
        "another directory, e.g. `cd " + folder + "`.",
        file=sys.stderr,
    )
    return 2


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
    min_p: float | None = 0.0,
    logit_bias: str | None = "",
    helps: Mapping[str, str] | None = None,
    from_model: bool = False,
) -> None:
    """Add `--temperature --top-k --top-p --seed --min-p --logit-bias` with these defaults; a
    flag whose default is None is left out. `helps` replaces the help text of some (by
    destination name). `--logit-bias` is text ("ID:BIAS,ID:BIAS"): `logit_bias_from_args`
    parses it.

    `from_model`: `--temperature --top-k --top-p` left unset default to the model's own
    generation settings with `--chat` (`jaxspec.generation_defaults`), else to the values
    given here; the command passes those settings to `sampling_from_args` once it knows them
    (the unset flags stay None in `args`)."""
    if from_model:
        fallback = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        types = {"temperature": float, "top_k": int, "top_p": float}
        for dest, value in fallback.items():
            if value is None:
                continue
            text = {**SAMPLING_HELP, **(helps or {})}[dest].replace(" (default %(default)s)", "")
            parser.add_argument(
                "--" + dest.replace("_", "-"),
                type=types[dest],
                default=None,
                help=f"{text} (default: the model's generation setting with --chat, else {value})",
            )
        parser.set_defaults(sampling_fallback={k: v for k, v in fallback.items() if v is not None})
        temperature = top_k = top_p = None
    flags = {
        "temperature": (temperature, float, None),
        "top_k": (top_k, int, None),
        "top_p": (top_p, float, None),
        "seed": (seed, int, None),
        "min_p": (min_p, float, None),
        "logit_bias": (logit_bias, str, None),
    }
    _add(parser, flags, SAMPLING_HELP, helps)


# -- penalties (issue 31): one self-contained block ------------------------------------
PENALTY_HELP = {
    "repetition_penalty": "divide the positive logits (multiply the others) of tokens in the "
    "prompt or the output so far by this; within [0.01, 100], 1 = off (default %(default)s)",
    "presence_penalty": "subtract this from the logit of every token already in the output; "
    "within +-2, 0 = off (default %(default)s)",
    "frequency_penalty": "subtract this times its count in the output from each token's "
    "logit; within +-2, 0 = off (default %(default)s)",
}
PENALTY_DEFAULTS = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def add_penalty_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--repetition-penalty --presence-penalty --frequency-penalty` (vLLM's semantics,
    `jaxspec.decoding.sampling`), off by default; `penalties_from_args` reads and checks them."""
    _add(parser, {k: (v, float, None) for k, v in PENALTY_DEFAULTS.items()}, PENALTY_HELP, None)


def penalties_from_args(args: argparse.Namespace) -> dict[str, float]:
    """The penalty flags by `SamplingSettings` field name (the defaults for flags a command
    left out); `sampling_from_args` checks them with the rest."""
    return {k: float(getattr(args, k, v)) for k, v in PENALTY_DEFAULTS.items()}


# -- end of the penalties block -------------------------------------------------------


MODEL_SAMPLING = ("temperature", "top_k", "top_p")  # what a model's settings give a chat


def model_sampling(model_settings: Mapping[str, float], unset: Collection[str]) -> dict:
    """What a chat takes from the model's own generation settings (`model_settings`, from
    `jaxspec.generation_defaults`): its temperature, top_k (an int; a GGUF stores a float)
    and top_p, for the fields in `unset` (those no flag or request field gave). The one rule
    of `edge generate --chat`, `jaxspec generate --chat` and the OpenAI endpoint's chats."""
    return {
        k: int(model_settings[k]) if k == "top_k" else float(model_settings[k])
        for k in MODEL_SAMPLING
        if k in model_settings and k in unset
    }


def _from_model(args: argparse.Namespace, settings: Mapping[str, float]) -> dict[str, float]:
    """The `from_model` flags left unset whose value the model's `settings` give (with
    `--chat` only: a plain continuation keeps the command's defaults)."""
    if getattr(args, "chat", None) is None:
        return {}
    fallback = getattr(args, "sampling_fallback", {})
    return model_sampling(settings, [d for d in fallback if getattr(args, d, None) is None])


def sampling_from_args(
    args: argparse.Namespace, model_settings: Mapping[str, float] | None = None
) -> SamplingSettings:
    """The one `SamplingSettings` of parsed flags (`add_sampling_flags`, `add_penalty_flags`):
    a flag the command left out takes the settings' default; a `from_model` flag left unset
    takes the model's `model_settings` (`jaxspec.generation_defaults`) with `--chat`, else the
    command's own default (also before the model is known: `model_settings` None). Making
    the settings is the check: `InvalidArgument` (a `ValueError`) naming the bad value."""
    fallback = getattr(args, "sampling_fallback", {})
    values: dict = {}
    for dest in ("temperature", "top_k", "top_p", "min_p"):
        value = getattr(args, dest, None)
        if value is None:
            value = fallback.get(dest)
        if value is not None:
            values[dest] = value
    values |= _from_model(args, model_settings or {})
    return SamplingSettings(
        **values, logit_bias=logit_bias_from_args(args), **penalties_from_args(args)
    )


def sampling_for_model(
    args: argparse.Namespace, model_settings: Mapping[str, float]
) -> tuple[SamplingSettings, str]:
    """A session's settings once the model is known, and what they take from the model in
    words ("" when nothing; e.g. "temperature 0.2, top_p 0.9 from the model's generation
    settings"). The settings `check_args` made (`args.sampling`) unless the model's
    `model_settings` fill an unset flag (`--chat`): then made once more, with them.
    Only settings that apply are said: when decoding is greedy (temperature 0, given or
    taken), the truncation settings (top_k, top_p) change nothing and go unsaid."""
    taken = _from_model(args, model_settings)
    sampling = getattr(args, "sampling", None)
    if taken or not isinstance(sampling, SamplingSettings):
        sampling = sampling_from_args(args, model_settings)
    if sampling.temperature == 0:
        taken = {k: v for k, v in taken.items() if k not in ("top_k", "top_p", "min_p")}
    said = [f"{dest} {value:g}" for dest, value in taken.items()]
    return sampling, f"{', '.join(said)} from the model's generation settings" if said else ""


def logit_bias_from_args(args: argparse.Namespace) -> dict[int, float]:
    """`--logit-bias "15:-100,42:2.5"` as `{15: -100.0, 42: 2.5}` ({} when absent); raises
    `ValueError` for an entry that is not ID:BIAS (`SamplingSettings` checks the values)."""
    text = getattr(args, "logit_bias", "") or ""
    out: dict[int, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        tok, sep, bias = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(tok)] = float(bias)
        except ValueError:
            raise ValueError(f"--logit-bias entries are ID:BIAS, got {item!r}") from None
    return out


def gamma_or_auto(text: str) -> int | str:
    """`--gamma`'s type where a command can choose block lengths: an int, or "auto"."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or {AUTO!r}, got {text!r}") from None


MAX_PORT = 65535


def port_number(text: str, *, zero_picks_free: bool = False) -> int:
    """A TCP port: an integer in [1, 65535], or 0 where the command documents that 0 picks a
    free one (`zero_picks_free`); `ValueError` naming the range otherwise."""
    low = 0 if zero_picks_free else 1
    try:
        port = int(text)
    except (TypeError, ValueError):
        port = None
    if port is None or not low <= port <= MAX_PORT:
        raise ValueError(f"a port is an integer in [{low}, {MAX_PORT}], got {text!r}")
    return port


def port_arg(*, zero_picks_free: bool = False):
    """argparse `type=` for a port flag (a bad one: the usual argparse error, exit 2)."""

    def parse(text: str) -> int:
        try:
            return port_number(text, zero_picks_free=zero_picks_free)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


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
    _add(parser, flags, DRAFT_HELP, helps)


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


def interrupted(command: str) -> int:
    """A command stopped by Ctrl-C: one line on stderr, exit status 130 (128 + SIGINT)."""
    print(f"{command}: interrupted", file=sys.stderr, flush=True)
    return 130


def add_cache_flag(parser: argparse.ArgumentParser) -> None:
    """Add `--compilation-cache DIR` (see `jaxspec_host.xla_cache`)."""
    parser.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help="keep compiled executables in DIR for the next run ('none': off; default: "
        "$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/jaxspec/xla or ~/.cache/jaxspec/xla)",
    )


def use_compilation_cache(args: argparse.Namespace) -> str | None:
    """Turn on the persistent compilation cache `--compilation-cache` names (call it before
    anything compiles); the directory in use, or None."""
    return configure_compilation_cache(compilation_cache_dir(args.compilation_cache))


def add_prompt_flags(parser: argparse.ArgumentParser) -> None:
    """`--prompt TEXT` (plain continuation) or `--chat TEXT` (one user message through the
    model's chat template; the answer ends at the template's end token). One is required."""
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="text to continue")
    g.add_argument("--chat", help="a user message, sent through the model's chat template")


def prompt_from_args(model: Model, args: argparse.Namespace) -> tuple[tuple[int, ...], str]:
    """`(token ids, text to print before the output)` for `--prompt` or `--chat`: a plain
    prompt is echoed before its continuation (with a tokenizer), a chat prints the answer."""
    if getattr(args, "chat", None) is not None:
        return chat_prompt(model, args.chat), ""
    echo = "" if model.tokenizer is None else args.prompt
    return encode_prompt(model, args.prompt), echo


# -- the serving commands' shared groups: the models, speculation, the verifier's sizes ------

QUANTIZE = ("w4a16", "w8a16", "none")  # the draft's weights on the edge
ROLES = ("verifier", "edge", "colocated", "demo", "generate")
# What --checkpoint, --draft and --quantize say in each command (the same flags, told from
# where the command stands): `verifier` python -m verify serve; `edge` python -m edge
# generate / serve; `colocated` jaxspec serve; `demo` jaxspec demo; `generate` jaxspec
# generate (co-located decoding: --checkpoint required, no --draft is plain decoding).
MODEL_HELP = {
    "checkpoint": {
        "verifier": "HF checkpoint dir, .gguf file, or a name: smollm2 (fetched on first use), "
        "default (the shipped tiny target); without it, --pair's target",
        "edge": "the target the verifier serves: only its tokenizer and chat template are "
        "loaded, to encode the prompt and decode the answer (default: --pair's)",
        "colocated": "the target: HF checkpoint dir, .gguf file, or a name (default: --pair's)",
        "demo": "target the spawned verifier serves (default: --pair's)",
        "generate": "HF checkpoint dir, .gguf file, or a name: default, default-draft, smollm2",
    },
    "draft": {
        "edge": "draft checkpoint or built-in name (default: --pair's; not with --gamma 0)",
        "colocated": "draft checkpoint or name (default: --pair's)",
        "demo": "draft checkpoint or built-in name (default: --pair's)",
        "generate": "draft checkpoint: speculative decoding (not with --gamma 0, which is "
        "plain decoding)",
    },
    "quantize": {
        "edge": "the draft's weights on this device",
        "colocated": "the draft's weights (as `python -m edge serve` holds them)",
        "demo": "the draft's weights on the edge",
    },
}


def add_model_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """`--checkpoint` (the target), `--draft`, `--pair` and `--quantize` (the draft's
    weights on the edge), those a command in `role` (`ROLES`) has, in that order. Models not
    named are `--pair`'s, a model named alone goes with its own pair's other half
    (`jaxspec_host.pairs.resolve`); `generate` has no `--pair`: its `--checkpoint` is
    required and without `--draft` it decodes plainly."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    helps = {flag: texts[role] for flag, texts in MODEL_HELP.items() if role in texts}
    parser.add_argument(
        "--checkpoint", default=None, required=role == "generate", help=helps["checkpoint"]
    )
    if "draft" in helps:
        parser.add_argument("--draft", default=None, help=helps["draft"])
    if role != "generate":
        add_pair_flag(parser)
    if "quantize" in helps:
        parser.add_argument("--quantize", default="w4a16", choices=QUANTIZE, help=helps["quantize"])


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


# What --verifier and --token say in the two commands that talk to a verifier as a client.
CLIENT_HELP = {
    "verifier": {
        "edge": "host:port of `python -m verify serve`; a fleet: host:port,host:port,... or a "
        "gRPC name with several addresses (dns:///verifiers:50051), balanced by gRPC's "
        "round_robin over the replicas that are SERVING, a session moving on when its "
        "replica dies or drains",
        "demo": "host:port of a running verifier",
    },
    "token": {
        "edge": "tenant bearer token (or $JAXSPEC_TOKEN)",
        "demo": "bearer token for --verifier ($JAXSPEC_TOKEN)",
    },
}


def add_client_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """`--verifier` (required for `edge`: `python -m edge`; the `demo` spawns one without
    it) and `--token`, the tenant's bearer token (`token_from_args`)."""
    helps = {flag: texts[role] for flag, texts in CLIENT_HELP.items()}
    parser.add_argument("--verifier", required=role == "edge", help=helps["verifier"])
    parser.add_argument("--token", default=None, help=helps["token"])


def token_from_args(args: argparse.Namespace) -> str | None:
    """The bearer token: `--token`, else $JAXSPEC_TOKEN, else None."""
    return args.token or os.environ.get("JAXSPEC_TOKEN")


def refused_line(command: str, e: VerifierError) -> str:
    """The one line a command says when a verifier refused it: the status, the reason and,
    when the token was missing or wrong, how to give one."""
    hint = ""
    if e.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        hint = " (give a tenant's token with --token or $JAXSPEC_TOKEN)"
    return f"{command}: {e.code}: {e}{hint}"


def positions(text: str) -> tuple[int, ...]:
    """`--kv-buckets`' type: "256,512" -> (256, 512)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positions like 256,512, got {text!r}") from None


# The verifier's sizes, as flags: (field of the scheduler's config, type, help in `python -m
# verify serve`, help in `jaxspec serve` or None where it has no such flag).
VERIFIER_LIMITS = (
    ("max_sessions", int, "KV slots (live sessions)", "requests served at once"),
    ("max_len", int, "positions per session", "positions per request (prompt + answer)"),
    ("max_gamma", int, "largest drafts per block", None),
    (
        "kv_buckets",
        positions,
        "slot positions a verify step may attend over, comma-separated and ending at "
        "--max-len (default: half the slot and the whole slot, for slots of 256 or more; "
        "each bucket is one more set of compiled step shapes)",
        None,
    ),
    ("max_sparse_k", int, "most q columns a sparse draft may carry", None),
    ("idle_timeout_s", float, "a session without progress this long is evicted", None),
)


def add_verifier_limits(
    parser: argparse.ArgumentParser, config: type, *, colocated: bool = False
) -> None:
    """The verifier's sizes (`--max-sessions --max-len --max-gamma --kv-buckets
    --max-sparse-k --idle-timeout-s`; `colocated`, `jaxspec serve`: the first two), each
    defaulting to the field of the same name of `config`, the scheduler's config dataclass
    (`verify.SchedulerConfig`): a default is stated once, there."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for field, type_, help_verifier, help_colocated in VERIFIER_LIMITS:
        if colocated and help_colocated is None:
            continue
        parser.add_argument(
            "--" + field.replace("_", "-"),
            type=type_,
            default=defaults[field],
            help=help_colocated if colocated else help_verifier,
        )


def is_loopback(host: str) -> bool:
    """Whether binding `host` reaches this machine only: "localhost" (any case) or a loopback
    IP (127.0.0.0/8, ::1, bracketed or not). Any other name or address (0.0.0.0, ::, a
    hostname) counts as reachable from outside. The one rule of every command that refuses
    to serve the network unprotected (`python -m verify serve`, the OpenAI endpoint)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
