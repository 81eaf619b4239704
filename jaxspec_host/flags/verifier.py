"""The verifier's flags: its sizes (`add_verifier_limits`, shared with `jaxspec serve`) and
every group of `python -m verify serve` (`add_verifier_serve_flags`). Defaults that belong to
the verifier's own modules (the scheduler's sizes, the connection and stream timeouts) are
passed in by `verify`, so each is stated once, there."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping

from jaxspec_host.flags.command import add_cache_flag, port_arg, port_number
from jaxspec_host.flags.models import add_model_flags


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


def mesh_arg(text: str) -> tuple[int, int]:
    """`--mesh`'s type: "data=N,model=M" -> (N, M), either left out meaning 1."""
    try:
        parts = dict(p.split("=") for p in text.split(","))
        data, model = int(parts.pop("data", 1)), int(parts.pop("model", 1))
    except ValueError:
        raise argparse.ArgumentTypeError("--mesh takes data=N,model=M") from None
    if parts or data < 1 or model < 1:
        raise argparse.ArgumentTypeError("--mesh takes data=N,model=M with N, M >= 1")
    return data, model


def coordinator_arg(text: str) -> str:
    """--coordinator: "auto", or host:port with a port in [1, 65535]."""
    if text == "auto":
        return text
    host, sep, port = text.rpartition(":")
    try:
        if not sep or not host:
            raise ValueError(f"--coordinator takes host:port or auto, got {text!r}")
        port_number(port)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_verifier_serve_flags(
    s: argparse.ArgumentParser, config: type, timeouts: Mapping[str, float]
) -> None:
    """`python -m verify serve`'s flags, one group after another in --help's order: where it
    listens, its devices, its sizes (defaulting to `config`'s fields, `verify.SchedulerConfig`),
    its timeouts (`timeouts`: the defaults `TIMEOUT_FLAGS` leaves to the verifier's modules, by
    destination), observability, the warm-up, multi-host, the compilation cache."""
    add_listen_flags(s)
    add_device_flags(s)
    add_verifier_limits(s, config)
    add_timeout_flags(s, timeouts)
    add_observability_flags(s)
    add_warmup_flags(s)
    add_multihost_flags(s)
    add_cache_flag(s)


def add_listen_flags(s: argparse.ArgumentParser) -> None:
    """What is served, where, and to whom: the target, the address, tenants and TLS."""
    add_model_flags(s, "verifier")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument(
        "--allow-insecure-public",
        action="store_true",
        help="serve a non-loopback --host without --tenants or without TLS (refused otherwise)",
    )
    s.add_argument(
        "--port",
        type=port_arg(zero_picks_free=True),
        default=50051,
        help="port to serve on; 0 picks a free one",
    )
    s.add_argument(
        "--tenants",
        default=None,
        metavar="FILE",
        help="TOML tenants file (tokens, limits); without it: no auth",
    )
    s.add_argument("--tls-cert", default=None, help="PEM certificate chain (enables TLS)")
    s.add_argument("--tls-key", default=None, help="PEM private key")


def add_device_flags(s: argparse.ArgumentParser) -> None:
    """The devices the target is sharded over, and its dtype."""
    s.add_argument("--mesh", type=mesh_arg, default=(1, 1), help="data=N,model=M devices")
    s.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the target's weights and activations",
    )


# How long a stream, a handshake, a connection and the drain may take, and streams per
# connection (`verify.serve`'s limits): (flag, type, default, help), in --help's order; a
# default of None is the verifier's own (`add_timeout_flags`' `timeouts`).
TIMEOUT_FLAGS = (
    ("--write-timeout-s", float, None,
     "a Verify stream whose client reads no answer this long is ended, its session closed"),
    ("--handshake-timeout-s", float, None,
     "a connection that has not finished its TLS / HTTP/2 handshake this long is closed"),
    ("--first-message-timeout-s", float, None,
     "a Verify stream that sends no first message (open, or a block naming its session) this "
     "long is ended DEADLINE_EXCEEDED"),
    ("--max-connection-idle-s", float, None,
     "a connection (TLS or not) with no RPC in flight this long is closed"),
    ("--max-connection-age-s", float, None,
     "a connection this old is sent GOAWAY: clients reconnect"),
    ("--max-connection-age-grace-s", float, None,
     "after GOAWAY for its age, the streams a connection still carries may run this long "
     "before it is closed"),
    ("--max-concurrent-streams", int, None,
     "most streams one connection carries at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; a "
     "stream beyond is refused)"),
    ("--drain-timeout-s", float, 30.0, "most time to drain"),
    ("--drain-min-s", float, 0.5, "least time NOT_SERVING"),
)  # fmt: skip


def add_timeout_flags(s: argparse.ArgumentParser, timeouts: Mapping[str, float]) -> None:
    """How long a stream, a handshake and the drain may take; connection limits. A flag
    whose `TIMEOUT_FLAGS` default is None takes `timeouts[its destination]`."""
    for flag, type_, default, text in TIMEOUT_FLAGS:
        if default is None:
            default = timeouts[flag[2:].replace("-", "_")]
        s.add_argument(flag, type=type_, default=default, help=text)


def add_observability_flags(s: argparse.ArgumentParser) -> None:
    """The Prometheus endpoint and gRPC reflection."""
    s.add_argument(
        "--metrics-port",
        type=port_arg(zero_picks_free=True),
        default=None,
        help="Prometheus text over HTTP on this port; 0 picks a free one",
    )
    s.add_argument(
        "--metrics-host", default="127.0.0.1", help="metrics bind address (default: loopback)"
    )
    s.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")


def add_warmup_flags(s: argparse.ArgumentParser) -> None:
    """Which step shapes compile before serving."""
    s.add_argument("--no-warmup", action="store_true", help="compile lazily (tests, demos)")
    s.add_argument(
        "--full-warmup",
        action="store_true",
        help="compile every batch shape before serving; without it the verifier serves as soon "
        "as a lone session's shapes (the smallest row bucket) are compiled and compiles the "
        "rest in the background (multi-host always compiles everything first)",
    )


def add_multihost_flags(s: argparse.ArgumentParser) -> None:
    """One verifier over several processes (docs/multihost.md)."""
    s.add_argument(
        "--coordinator",
        type=coordinator_arg,
        default=None,
        help="multi-host: host:port of process 0's jax.distributed coordinator, or auto "
        "(detected: TPU pod slices, SLURM, ...); docs/multihost.md",
    )
    s.add_argument("--num-processes", type=int, default=None, help="multi-host: processes")
    s.add_argument("--process-id", type=int, default=None, help="multi-host: 0 serves gRPC")
    s.add_argument(
        "--heartbeat-timeout-s",
        type=int,
        default=10,
        help="multi-host: a process silent this long is dead (the others exit 3)",
    )
