"""The OpenAI endpoint's flags, shared by `python -m edge serve` and `jaxspec serve`
(`add_serve_flags`: the address, the key, the model's name and chat template, speculation
under load, and the HTTP bounds), checked by `check_serve_args` before anything loads; and
`HttpLimits`, the bounds they make (what `edge.http_guard` enforces)."""

from __future__ import annotations

import argparse
import dataclasses
import os

from jaxspec_host.flags.command import add_max_new_tokens, is_loopback, port_arg


@dataclasses.dataclass(frozen=True, kw_only=True)
class HttpLimits:
    """The HTTP side's bounds (docs/service.md lists them with their flags): a request's
    head (request line and headers, at most `max_header_bytes`: h11's limit) must arrive
    within `header_timeout_s` of its connection opening or of the previous answer, its body
    (at most `max_body_bytes`, else 413) within `body_timeout_s` (else 408); a keep-alive
    connection idle `keep_alive_s` after an answer is closed (uvicorn's `timeout_keep_alive`);
    at most `max_connections` are open (lowered to what the process's file limit allows),
    and a new one past it closes the one idle longest (503 when none is idle)."""

    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1000
    max_header_bytes: int = 16 << 10

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"{field.name} must be > 0, got {value}")


def check_api_key(key: str) -> str:
    """`key` if a client can send it (`Authorization: Bearer <key>`): visible ASCII, no
    spaces; `ValueError` otherwise (a blank key no client could match, a character a header
    cannot carry as the client would send it)."""
    if not key or not all("!" <= c <= "~" for c in key):
        raise ValueError(
            "--api-key (or $JAXSPEC_API_KEY) must be visible ASCII without spaces, got "
            f"{len(key)} characters that are not"
        )
    return key


def add_serve_flags(parser: argparse.ArgumentParser, plain_past: int = -1) -> None:
    """`--host --port --api-key --served-model-name --chat-template --max-new-tokens
    --allow-insecure-public --speculative-disable-by-batch-size` (default `plain_past`) and
    the HTTP bounds (`HttpLimits`): the HTTP side of both serve commands."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    parser.add_argument(
        "--port", type=port_arg(zero_picks_free=True), default=8000, help="0 picks a free one"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="clients must send `Authorization: Bearer KEY` (or $JAXSPEC_API_KEY; visible "
        "ASCII, no spaces); without it anyone who reaches the port is served",
    )
    parser.add_argument(
        "--allow-insecure-public",
        action="store_true",
        help="serve a non-loopback --host without --api-key (refused otherwise)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the model id clients name (default: its name)"
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template for /v1/chat/completions, replacing the model's own (a "
        "model without one, such as the shipped tiny pair, needs it for chat)",
    )
    add_max_new_tokens(
        parser, 256, what=" for a chat request that gives no max_tokens (completions: 16)"
    )
    parser.add_argument(
        "--speculative-disable-by-batch-size",
        type=int,
        default=plain_past,
        metavar="N",
        help="a request that arrives while more than N requests run decodes without "
        "speculation (vLLM's flag: on a server's own cores the drafts of many sessions cost "
        "more than they save); -1: always speculate (default %(default)s)",
    )
    d = HttpLimits()
    g = parser.add_argument_group("HTTP bounds")
    g.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="a larger request body is refused, 413")  # fmt: skip
    g.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="open connections at most (lowered to what the process's file limit "
                   "allows); past it the one idle longest is closed")  # fmt: skip
    g.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                   help="a request's head must arrive within this of its connection opening "
                   "(or the previous answer), else the connection is closed")  # fmt: skip
    g.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s,
                   help="a request's body must arrive within this, else 408")  # fmt: skip
    g.add_argument("--keep-alive-s", type=float, default=d.keep_alive_s,
                   help="an idle keep-alive connection is closed after this")  # fmt: skip


def check_serve_args(args: argparse.Namespace) -> None:
    """The serve flags, before anything loads: `ValueError` naming the bad one. Fills
    `args.api_key` from $JAXSPEC_API_KEY (checked: a key no client can send is refused, a
    blank one included), `args.http_limits` and `args.chat_template_text` from the file."""
    n = args.speculative_disable_by_batch_size
    if n < -1:
        raise ValueError(f"--speculative-disable-by-batch-size must be >= -1, got {n}")
    if n == -1:
        args.speculative_disable_by_batch_size = None
    if args.api_key is None:  # an empty $JAXSPEC_API_KEY is an unset one
        args.api_key = os.environ.get("JAXSPEC_API_KEY") or None
    if args.api_key is not None:
        check_api_key(args.api_key)
    if not is_loopback(args.host) and args.api_key is None and not args.allow_insecure_public:
        raise ValueError(
            f"--host {args.host} is not loopback: give --api-key (or $JAXSPEC_API_KEY), or "
            "--allow-insecure-public to serve anyone who reaches it"
        )
    flags = {"max_body_bytes": "--max-body-bytes", "max_connections": "--max-connections",
             "header_timeout_s": "--header-timeout-s", "body_timeout_s": "--body-timeout-s",
             "keep_alive_s": "--keep-alive-s"}  # fmt: skip
    for field, flag in flags.items():
        if not getattr(args, field) > 0:
            raise ValueError(f"{flag} must be > 0, got {getattr(args, field)}")
    args.http_limits = HttpLimits(**{field: getattr(args, field) for field in flags})
    args.chat_template_text = None
    if args.chat_template is not None:
        with open(args.chat_template, encoding="utf-8") as f:  # OSError: exit status 2
            args.chat_template_text = f.read()
