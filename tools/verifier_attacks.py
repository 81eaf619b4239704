"""Issue 40's attacks A-E against a real `python -m verify serve` (the shipped tiny target,
three tenants, TLS, loopback), with the figures the issue gave for each:

  A  1,200 Verify streams on one connection, each opened, half-closed, then reset (what
     `call.done_writing()` then `call.cancel()` do), in bursts of 16: sessions left live
  B  300 TLS connections that finish the handshake and send nothing, no token: the server's
     open file descriptors then, and after --max-connection-idle-s (+15 s)
  C  2,000 authenticated Verify streams on one connection that send no first message: how
     many the server ends, and how, by --first-message-timeout-s (+15 s)
  D  a tenant's step_s alone and beside another tenant's 6 sessions (a timing channel)
  E  repetition_penalty 1e-40, 1e-45, 1.18e-38 (each gave token 0 every time): the status,
     and the bounds' tokens

    PYTHONPATH=. python tools/verifier_attacks.py                 # all, the server's defaults
    PYTHONPATH=. python tools/verifier_attacks.py --only A,E
    PYTHONPATH=. python tools/verifier_attacks.py -- --max-connection-idle-s 5

Flags after `--` go to the server. Prints one line per attack. Timings are the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pathlib
import select
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events

from edge.client import GrpcEndpoint
from jaxspec.proto import verifier_pb2 as pb
from jaxspec.proto import verifier_pb2_grpc as pb_grpc
from jaxspec.protocol import DraftBlock, DraftSpec, SamplingSettings, SessionConfig, wire
from verify.process import VerifierProcess

TOKENS = {"alice": "alice-attack-token", "bob": "bob-attack-token", "ops": "ops-attack-token"}
OPEN = SessionConfig(prompt=(1, 2), max_new_tokens=4, draft=DraftSpec(gamma=0))


def write_files(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A tenants file (alice, bob: 8 sessions each; ops: admin) and a self-signed
    certificate for 127.0.0.1: (tenants, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    tenants = root / "tenants.toml"
    tenants.write_text(
        "".join(
            f'[tenants.{n}]\ntoken = "{t}"\nmax_sessions = {2000 if n == "alice" else 8}\n'
            + ("admin = true\n" if n == "ops" else "")
            + "\n"
            for n, t in TOKENS.items()
        )
    )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (root / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    private = serialization.PrivateFormat.PKCS8
    pem = key.private_bytes(serialization.Encoding.PEM, private, serialization.NoEncryption())
    (root / "key.pem").write_bytes(pem)
    return tenants, root / "cert.pem", root / "key.pem"


class Target:
    """The server under attack: its process, port, certificate, and an admin's Stats."""

    def __init__(self, root: pathlib.Path, extra: Sequence[str]):
        tenants, self.cert, key = write_files(root)
        self.proc = VerifierProcess(
            ["--checkpoint", "default", "--tenants", str(tenants), "--tls-cert", str(self.cert),
             "--tls-key", str(key), "--max-sessions", "32", "--max-len", "64", *extra],
            env={"JAX_PLATFORMS": "cpu"},
        ).start()  # fmt: skip
        self.proc.wait_ready(300)
        self.port = self.proc.port
        creds = grpc.ssl_channel_credentials(self.cert.read_bytes())
        self.channel = grpc.secure_channel(f"127.0.0.1:{self.port}", creds)

    def sessions(self) -> int:
        md = (("authorization", f"Bearer {TOKENS['ops']}"),)
        stub = pb_grpc.VerifierStub(self.channel)
        return stub.Stats(pb.StatsRequest(), metadata=md, timeout=30).sessions

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def close(self) -> None:
        self.channel.close()
        self.proc.stop()


def tls_socket(port: int) -> ssl.SSLSocket:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # our own self-signed server
    ctx.set_alpn_protocols(["h2"])
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="x")


class H2:
    """A raw HTTP/2 client connection over TLS."""

    def __init__(self, port: int):
        self.port, self.sock = port, tls_socket(port)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(cfg)
        self.conn.initiate_connection()
        self.ended: dict[int, str] = {}  # stream -> how the server ended it
        self.answered: set[int] = set()
        self.flush()

    def flush(self) -> None:
        if out := self.conn.data_to_send():
            self.sock.sendall(out)

    def open(self, token: str, message: bytes | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"), (":scheme", "https"), (":path", "/jaxspec.v1.Verifier/Verify"),
            (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"),
            ("te", "trailers"), ("authorization", f"Bearer {token}"),
        ]  # fmt: skip
        self.conn.send_headers(sid, headers)
        if message is not None:
            self.conn.send_data(sid, b"\0" + len(message).to_bytes(4, "big") + message)
        return sid

    def pump(self, wait_s: float) -> bool:
        """Read what came within `wait_s`; False once the server closed the connection."""
        if not select.select([self.sock], [], [], wait_s)[0]:
            return True
        try:
            data = self.sock.recv(1 << 20)
        except (ConnectionResetError, ssl.SSLError):
            return False
        if not data:
            return False
        try:
            events = self.conn.receive_data(data)
        except Exception:  # frames after a GOAWAY
            return True
        for ev in events:
            sid = getattr(ev, "stream_id", 0)
            if isinstance(ev, h2.events.DataReceived):
                self.answered.add(sid)
                self.conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.TrailersReceived):
                self.ended.setdefault(sid, "status " + dict(ev.headers).get("grpc-status", "?"))
            elif isinstance(ev, h2.events.StreamReset):
                self.ended.setdefault(sid, f"reset {ev.error_code!s}")
        self.flush()
        return True


def attack_a(t: Target, n: int = 1200, burst: int = 16) -> str:
    """Streams opened, answered, half-closed then reset 0-2 ms later, `burst` at a time."""
    opener = pb.VerifyRequest(open=wire.config_to_proto(OPEN)).SerializeToString()
    c = H2(t.port)
    for r in range(n // burst):
        ids = [c.open(TOKENS["alice"], opener) for _ in range(burst)]
        c.flush()
        deadline = time.monotonic() + 60
        while not all(s in c.answered or s in c.ended for s in ids):
            if time.monotonic() > deadline or not c.pump(0.2):
                break
        for s in ids:
            if s not in c.ended:
                c.conn.end_stream(s)
        c.flush()
        time.sleep((r % 20) * 1e-4)
        for s in ids:
            if s not in c.ended and not c.conn.streams[s].closed:
                c.conn.reset_stream(s, h2.errors.ErrorCodes.CANCEL)
        c.flush()
        c.pump(0.0)
    c.sock.close()
    time.sleep(5)
    return f"A: {n:,} half-close+cancel streams: {t.sessions()} sessions left live 5 s later"


def attack_b(t: Target, n: int = 300, idle_s: float = 60.0) -> str:
    """Idle TLS + HTTP/2 connections without a token: the server's fds, then after the
    idle limit; how many the server closed."""
    before = t.fds()
    conns = [H2(t.port) for _ in range(n)]
    for c in conns:  # the server's SETTINGS acknowledged: HTTP/2 set up, then nothing
        c.pump(1.0)
    opened = t.fds()
    time.sleep(idle_s + 15)
    after = t.fds()
    closed = 0
    for c in conns:
        while (alive := c.pump(0.05)) and select.select([c.sock], [], [], 0)[0]:
            pass  # read the GOAWAY, then the close
        closed += not alive
        c.sock.close()
    return (
        f"B: {n} idle TLS connections, no token: server fds {before} -> {opened}, "
        f"{after} after {idle_s + 15:g} s; {closed} of {n} closed by the server"
    )


def attack_c(t: Target, n: int = 2000, first_s: float = 30.0) -> str:
    """Authenticated Verify streams on one connection that send nothing."""
    c = H2(t.port)
    for _ in range(n):  # all before the server's SETTINGS are read: its stream limit ignored
        c.open(TOKENS["alice"])
    c.flush()
    deadline = time.monotonic() + first_s + 15
    while time.monotonic() < deadline and len(c.ended) < n and c.pump(0.2):
        pass
    kinds: dict[str, int] = {}
    for how in c.ended.values():
        kinds[how] = kinds.get(how, 0) + 1
    c.sock.close()
    return f"C: {n:,} idle authenticated Verify streams: {len(c.ended)} ended by the server {kinds}"


async def _step_s(t: Target, tenant: str, cfg: SessionConfig) -> list[float]:
    """A gamma-0 session of `tenant`, block by block: each result's step_s."""
    ca = str(t.cert)
    async with GrpcEndpoint(
        f"127.0.0.1:{t.port}", token=TOKENS[tenant], tls_ca=ca, timeout_s=120
    ) as ep:
        info = await ep.open_session(cfg)
        out, start, done = [], len(cfg.prompt), False
        while not done:
            block = DraftBlock(session_id=info.session_id, epoch=0, start=start, tokens=())
            res = await ep.verify(block)
            out.append(res.step_s)
            start, done = start + len(res.tokens), res.finished
        await ep.close_session(info.session_id)
    return out


def attack_d(t: Target) -> str:
    cfg = SessionConfig(prompt=(3, 4, 5), max_new_tokens=24, seed=7, draft=DraftSpec(gamma=0))

    async def beside() -> tuple[list[float], list[float]]:
        bob = [asyncio.ensure_future(_step_s(t, "bob", cfg)) for _ in range(6)]
        mine, admin = await asyncio.gather(_step_s(t, "alice", cfg), _step_s(t, "ops", cfg))
        await asyncio.gather(*bob)
        return mine, admin

    alone = asyncio.run(_step_s(t, "alice", cfg))
    loaded, admin = asyncio.run(beside())

    def ms(xs: list[float]) -> str:
        return f"{1000 * sum(xs) / len(xs):.2f} ms"

    return (
        f"D: alice's step_s alone {ms(alone)}, beside bob's 6 sessions {ms(loaded)} "
        f"(nonzero values: {sum(x > 0 for x in alone + loaded)}); an admin's beside them "
        f"{ms(admin)}"
    )


def attack_e(t: Target) -> str:
    stub = pb_grpc.VerifierStub(t.channel)
    md = (("authorization", f"Bearer {TOKENS['alice']}"),)
    cfg = SessionConfig(prompt=(3, 4, 5), max_new_tokens=16, seed=3, draft=DraftSpec(gamma=0),
                        sampling=SamplingSettings(temperature=1.0))  # fmt: skip
    out = []
    for r in (1e-40, 1e-45, 1.18e-38):
        req = wire.config_to_proto(cfg)
        req.repetition_penalty = r
        try:
            sid = stub.OpenSession(req, metadata=md, timeout=30).session_id
        except grpc.RpcError as e:
            out.append(f"{r:g}: {e.code().name} {e.details()!r}")
            continue
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid), metadata=md, timeout=30)
        sampled = SamplingSettings(temperature=1.0, repetition_penalty=r)  # taken: run it
        res = asyncio.run(_tokens(t, dataclasses.replace(cfg, sampling=sampled)))
        out.append(f"{r:g}: opened, {sum(x == 0 for x in res)} of {len(res)} tokens are 0")
    tokens = {}
    for r in (0.01, 100.0):
        sampled = SamplingSettings(temperature=1.0, repetition_penalty=r)
        res = asyncio.run(_tokens(t, dataclasses.replace(cfg, sampling=sampled)))
        tokens[r] = f"{sum(x == 0 for x in res)} of {len(res)} tokens are 0"
    return f"E: {'; '.join(out)}; at the bounds: {tokens}"


async def _tokens(t: Target, cfg: SessionConfig) -> list[int]:
    ca = str(t.cert)
    async with GrpcEndpoint(
        f"127.0.0.1:{t.port}", token=TOKENS["alice"], tls_ca=ca, timeout_s=120
    ) as ep:
        info = await ep.open_session(cfg)
        out: list[int] = []
        while len(out) < cfg.max_new_tokens:
            start = len(cfg.prompt) + len(out)
            res = await ep.verify(DraftBlock(session_id=info.session_id, epoch=0, start=start,
                                             tokens=()))  # fmt: skip
            out += res.tokens
            if res.finished:
                break
        await ep.close_session(info.session_id)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="A,B,C,D,E", help="which attacks, e.g. A,E")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    def flag(name: str, default: float) -> float:
        return float(extra[extra.index(name) + 1]) if name in extra else default

    attacks: dict[str, Any] = {
        "A": attack_a,
        "B": lambda t: attack_b(t, idle_s=flag("--max-connection-idle-s", 60.0)),
        "C": lambda t: attack_c(t, first_s=flag("--first-message-timeout-s", 30.0)),
        "D": attack_d,
        "E": attack_e,
    }
    with tempfile.TemporaryDirectory() as d:
        t = Target(pathlib.Path(d), extra)
        try:
            for name in args.only.split(","):
                print(attacks[name.strip()](t), flush=True)
        finally:
            t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
