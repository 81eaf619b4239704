"""What every command's parser shares: the help format (defaults shown), subcommands with a
"did you mean" for an unknown flag, the shadowed-package refusal, `--max-new-tokens`,
`--compilation-cache`, ports, Ctrl-C's exit status, and `is_loopback`, the one rule of which
`--host` is reachable from this machine only.

`add_flags` is how the flag groups of this package add a table of flags (destination ->
default, type, choices) with their help texts, leaving out those whose default is None.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import ipaddress
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from jaxspec_host.xla_cache import compilation_cache_dir, configure_compilation_cache


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


def add_flags(
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
