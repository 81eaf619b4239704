"""Helpers shared by the gRPC tests: checkpoints, certificates, servers and clients."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import ipaddress
import os
import pathlib
import re
import socket
import time

import grpc

import jaxspec
from edge.client import GrpcEndpoint
from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.ckpts.tiny import write_random_checkpoint
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig
from verify import LocalVerifier, SchedulerConfig
from verify.process import VerifierProcess

TOKENS = {
    "alice": "alice-secret-token",
    "bob": "bob-secret-token",
    "carol": "carol-token",
    "ops": "ops-secret-token",  # admin: its Stats are the whole verifier's
}
SERVER_FLAGS = ["--max-sessions", "8", "--max-gamma", "4", "--max-len", "128", "--no-warmup"]


def write_models(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A random tiny target and draft (byte tokenizer) in HF format."""
    return (
        write_random_checkpoint(root / "target", seed=0),
        write_random_checkpoint(root / "draft", seed=1),
    )


def write_tenants(path: pathlib.Path) -> pathlib.Path:
    path.write_text(
        f'[tenants.alice]\ntoken = "{TOKENS["alice"]}"\n\n'
        f'[tenants.bob]\ntoken = "{TOKENS["bob"]}"\nmax_sessions = 4\n\n'
        f'[tenants.carol]\ntoken = "{TOKENS["carol"]}"\nmax_sessions = 1\ntokens_per_s = 40\n\n'
        f'[tenants.ops]\ntoken = "{TOKENS["ops"]}"\nmax_sessions = 1\nadmin = true\n'
    )
    return path


def self_signed(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate for localhost / 127.0.0.1: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = root / "cert.pem", root / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(cache_dir: pathlib.Path, devices: int | None = None) -> dict[str, str]:
    """Restarted servers reuse compiled steps through JAX's persistent cache: the test run's
    (tests/conftest.py), shared with every other module, else `cache_dir`."""
    env = {
        "JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(cache_dir),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PLATFORMS": "cpu",
    }
    if devices:
        env["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
        )
    return env


def spawn_tls_tenants(root: pathlib.Path):
    """Tiny target and draft under `root`, and a server over TLS with the three tenants of
    `write_tenants`, metrics on a free port: (target dir, draft dir, CA cert, server)."""
    target, draft = write_models(root)
    cert, key = self_signed(root)
    tenants = write_tenants(root / "tenants.toml")
    server = spawn(
        target,
        "--tenants", str(tenants), "--tls-cert", str(cert), "--tls-key", str(key),
        "--metrics-port", "0", "--idle-timeout-s", "60",
        env=server_env(root / "jax-cache"),
    )  # fmt: skip
    return target, draft, cert, server


def metrics_address(server: VerifierProcess) -> tuple[str, int]:
    """(host, port) of the metrics endpoint, from the server's "serving" line."""
    m = re.search(r"metrics on http://([^\s/]+):(\d+)/metrics", server.log)
    assert m is not None, server.log[-3000:]
    return m.group(1), int(m.group(2))


def spawn(checkpoint: pathlib.Path, *extra: str, port: int = 0, env=None) -> VerifierProcess:
    server = VerifierProcess(
        ["--checkpoint", str(checkpoint), *SERVER_FLAGS, *extra], port=port, env=env
    )
    server.start().wait_ready(180)
    return server


@functools.cache
def drafter(draft_dir: str, gamma: int, encoding: str) -> Drafter:
    return Drafter(jaxspec.load(draft_dir), DraftSpec(gamma=gamma, encoding=encoding, sparse_k=4))


SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingSettings))


def config(prompt=(1, 2, 3, 4), **kw) -> SessionConfig:
    """A `SessionConfig` from flat keywords (gamma, encoding, sparse_k go to its DraftSpec,
    the sampling fields to its SamplingSettings; temperature 1 unless given)."""
    base = dict(prompt=tuple(prompt), max_new_tokens=24, mode="pipelined")
    spec = dict(gamma=4, sparse_k=4)
    spec.update({k: kw.pop(k) for k in ("gamma", "encoding", "sparse_k") if k in kw})
    sampling = SamplingSettings(
        **{"temperature": 1.0, **{k: kw.pop(k) for k in SAMPLING if k in kw}}
    )
    base.update(kw)
    return SessionConfig(**base, sampling=sampling, draft=DraftSpec(**spec))


# The well-behaved tenant's session, whose tokens must not change whatever others do.
BOB_CFG = config(prompt=(5, 6, 7), max_new_tokens=48, mode="sync", gamma=2, seed=11)


# The test servers compile lazily (--no-warmup): a first block of a new shape waits for its
# compile, which on a loaded 2-core CI machine has taken longer than 20 s.
ENDPOINT_TIMEOUT_S = 120.0


def endpoint(address: str, token: str | None = None, ca: pathlib.Path | None = None):
    tls_ca = None if ca is None else str(ca)
    return GrpcEndpoint(address, token=token, tls_ca=tls_ca, timeout_s=ENDPOINT_TIMEOUT_S)


async def session(address, draft_dir, cfg, token=None, ca=None, depth=2, **kw):
    """One edge session over gRPC; returns its SessionTrace (gamma 0: no drafter)."""
    d = drafter(str(draft_dir), cfg.draft.gamma, cfg.draft.encoding) if cfg.draft.gamma else None
    async with endpoint(address, token, ca) as ep:
        return await run_session(ep, d, cfg, depth=depth, **kw)


async def local_session(target_dir, draft_dir, cfg, depth=2):
    """The same session against an in-process LocalVerifier (the servers' flags)."""
    config = SchedulerConfig(max_sessions=8, max_len=128, max_gamma=4)  # rows 1, 2, 4, 8
    v = LocalVerifier(jaxspec.load(target_dir), config)
    try:
        d = drafter(str(draft_dir), cfg.draft.gamma, cfg.draft.encoding)
        return await run_session(v, d, cfg, depth=depth)
    finally:
        await v.aclose()


def run(coro):
    return asyncio.run(coro)


def channel(address: str, ca: pathlib.Path | None = None) -> grpc.Channel:
    """A synchronous channel (fuzzing and raw calls)."""
    if ca is None:
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    return grpc.secure_channel(address, creds)


def auth(tenant: str | None) -> tuple[tuple[str, str], ...]:
    return () if tenant is None else (("authorization", f"Bearer {TOKENS[tenant]}"),)


def wait_until(condition, seconds: float = 60.0, poll_s: float = 0.02) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False); generous timeouts:
    the tests run under load."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
