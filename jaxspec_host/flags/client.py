"""The flags of the commands that talk to a verifier as a client (`python -m edge`, `jaxspec
demo`): `--verifier` and `--token`, the line said when a verifier refuses, and the groups
`python -m edge generate` and `serve` share (TLS, the session's retries)."""

from __future__ import annotations

import argparse
import os

from jaxspec.protocol import VerifierError
from jaxspec_host.flags.command import add_cache_flag
from jaxspec_host.flags.drafting import add_speculation_flags
from jaxspec_host.flags.models import add_model_flags

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


def add_edge_client_flags(g: argparse.ArgumentParser) -> None:
    """The flags `python -m edge generate` and `serve` share: the verifier, the token, the
    models, TLS."""
    add_client_flags(g, "edge")
    add_model_flags(g, "edge")
    g.add_argument("--tls-ca", default=None, help="PEM CA to trust: enables TLS")
    g.add_argument("--tls", action="store_true", help="TLS with the system's CAs")


def add_edge_session_flags(g: argparse.ArgumentParser) -> None:
    """The draft, pipeline and retry flags of an edge session (`python -m edge generate` and
    `serve`)."""
    add_speculation_flags(g)
    add_cache_flag(g)
    g.add_argument(
        "--resume-timeout-s",
        type=float,
        default=30.0,
        help="how long an unavailable verifier is retried, at start and after it went away "
        "mid-session (default %(default)s)",
    )
    g.add_argument(
        "--timeout-s", type=float, default=30.0, help="deadline of each call to the verifier"
    )
