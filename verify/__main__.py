"""`python -m verify serve`: the verifier service (start-up in verify/serve.py).

    python -m verify serve --port 50051                        # default target, loopback, open
    python -m verify serve --checkpoint ckpt --host 0.0.0.0 --port 443 \\
        --tenants tenants.toml --tls-cert cert.pem --tls-key key.pem --mesh data=4,model=2

It prints one line `jaxspec verifier serving <checkpoint> on <host>:<port>` once every step
shape is compiled and it takes requests (with `--metrics-port`, the line goes on
`, metrics on http://<metrics host>:<port>/metrics`; the metrics bind to loopback unless
`--metrics-host` says otherwise, whatever `--host` is). SIGTERM (or Ctrl-C) drains: health
NOT_SERVING, new sessions UNAVAILABLE, blocks already received answered, then exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

import jax.numpy as jnp

import jaxspec
from verify.local import LocalVerifier
from verify.scheduler import SchedulerConfig, row_buckets_for
from verify.serve import start
from verify.step import make_mesh
from verify.tenants import ANONYMOUS, Tenants

log = logging.getLogger("verify")


def _mesh_arg(text: str) -> tuple[int, int]:
    try:
        parts = dict(p.split("=") for p in text.split(","))
        data, model = int(parts.pop("data", 1)), int(parts.pop("model", 1))
    except ValueError:
        raise argparse.ArgumentTypeError("--mesh takes data=N,model=M") from None
    if parts or data < 1 or model < 1:
        raise argparse.ArgumentTypeError("--mesh takes data=N,model=M with N, M >= 1")
    return data, model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verify", description="the jaxspec verifier")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve jaxspec.v1.Verifier over gRPC")
    s.add_argument("--checkpoint", default="default", help="HF checkpoint dir or built-in name")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    s.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    s.add_argument("--tenants", default=None, help="TOML tenants file; without it: no auth")
    s.add_argument("--tls-cert", default=None, help="PEM certificate chain (enables TLS)")
    s.add_argument("--tls-key", default=None, help="PEM private key")
    s.add_argument("--mesh", type=_mesh_arg, default=(1, 1), help="data=N,model=M devices")
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    s.add_argument("--max-sessions", type=int, default=64, help="KV slots (live sessions)")
    s.add_argument("--max-len", type=int, default=512, help="positions per session")
    s.add_argument("--max-gamma", type=int, default=8, help="largest drafts per block")
    s.add_argument("--max-sparse-k", type=int, default=16)
    s.add_argument("--idle-timeout-s", type=float, default=300.0)
    s.add_argument("--drain-timeout-s", type=float, default=30.0, help="most time to drain")
    s.add_argument("--drain-min-s", type=float, default=0.5, help="least time NOT_SERVING")
    s.add_argument("--metrics-port", type=int, default=None, help="Prometheus text over HTTP")
    s.add_argument(
        "--metrics-host", default="127.0.0.1", help="metrics bind address (default: loopback)"
    )
    s.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    s.add_argument("--no-warmup", action="store_true", help="compile lazily (tests, demos)")
    return p


def scheduler_config_from_args(args: argparse.Namespace) -> SchedulerConfig:
    """The scheduler the flags describe: row buckets from --max-sessions, each a multiple of
    the mesh's data shards."""
    data, _ = args.mesh
    return SchedulerConfig(
        max_sessions=args.max_sessions,
        max_len=args.max_len,
        max_gamma=args.max_gamma,
        max_sparse_k=args.max_sparse_k,
        row_buckets=row_buckets_for(args.max_sessions, data),
        idle_timeout_s=args.idle_timeout_s,
    )


def make_verifier(args: argparse.Namespace) -> LocalVerifier:
    """Load the target and build the verifier the flags describe."""
    config = scheduler_config_from_args(args)  # before loading: bad flags fail fast
    data, model_par = args.mesh
    mesh = make_mesh(data, model_par) if data * model_par > 1 else None
    model = jaxspec.load(args.checkpoint, dtype=getattr(jnp, args.dtype))
    return LocalVerifier(model, config, mesh=mesh)


async def _serve(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        with open(args.tls_key, "rb") as k, open(args.tls_cert, "rb") as c:
            tls = (k.read(), c.read())
    if args.tenants:
        tenants = Tenants.load(args.tenants)
    else:
        tenants = Tenants(None)
        log.warning("no --tenants file: every caller is accepted as tenant %r", ANONYMOUS)
    verifier = make_verifier(args)
    if not args.no_warmup:
        await asyncio.get_running_loop().run_in_executor(None, verifier.scheduler.warmup)
    server = await start(
        verifier,
        host=args.host,
        port=args.port,
        tenants=tenants,
        tls=tls,
        reflection=args.reflection,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    m = server.metrics
    extra = f", metrics on http://{m.host}:{m.port}/metrics" if m is not None else ""
    print(
        f"jaxspec verifier serving {args.checkpoint} on {args.host}:{server.port}"
        f"{' (TLS)' if tls else ''}{extra}",
        flush=True,
    )
    await stop.wait()
    log.warning("draining: no new sessions; answering the blocks already received")
    await server.drain(args.drain_timeout_s, args.drain_min_s)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    logging.getLogger("verify").setLevel(logging.INFO)
    try:
        return asyncio.run(_serve(args))
    except (ValueError, OSError, RuntimeError) as e:
        print(f"python -m verify serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
