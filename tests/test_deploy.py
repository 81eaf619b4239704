"""The shipped deploy/ configs: they parse, their verifier flags exist, and the nginx one
really balances: two `python -m verify serve` replicas behind nginx (grpc_pass, HTTP/2) built
from deploy/nginx.conf with only the addresses changed, sessions through it, one replica
SIGKILLed mid-generation, every session ends with the tokens of an undisturbed run.

nginx comes from the OS packages (.ci/run installs it); without it these tests fail."""

from __future__ import annotations

import asyncio
import pathlib
import re
import shutil
import socket
import subprocess
import time

import grpc
import pytest
import yaml

import jaxspec
from edge.client import error_from_rpc
from edge.session import run_session
from jaxspec.protocol import Unavailable
from jaxspec_apps.bench.fleet import Fault
from tests import grpc_helpers as h
from verify import LocalVerifier, SchedulerConfig
from verify.__main__ import build_parser
from verify.process import VerifierProcess

DEPLOY = pathlib.Path(__file__).resolve().parent.parent / "deploy"
# The shipped nginx.conf's replica lines and listen line (what a user edits).
UPSTREAM_SERVER = re.compile(r"^([ \t]*)server\s+[\w.\-]+:\d+(\s[^;]*)?;", re.M)
LISTEN = re.compile(r"^([ \t]*)listen\s+\d+(\s+http2;)", re.M)


def nginx() -> str:
    """The nginx binary: on PATH or where Debian puts it; missing is a failure, not a skip."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.fail("nginx is not installed (apt-get install nginx; .ci/run does)")
    return found


def render_nginx(listen_port: int, replicas: list[str]) -> str:
    """deploy/nginx.conf with its replicas replaced by `replicas` ("host:port", same server
    parameters) and its listen port by a loopback one; nothing else changes."""
    text = (DEPLOY / "nginx.conf").read_text()
    shipped = UPSTREAM_SERVER.findall(text)
    assert len(shipped) >= 2, "deploy/nginx.conf should list its replicas as `server h:p ...;`"
    indent, params = shipped[0]
    lines = "\n".join(f"{indent}server {r}{params};" for r in replicas)
    first = UPSTREAM_SERVER.search(text)
    text = text[: first.start()] + lines + UPSTREAM_SERVER.sub("", text[first.start() :])
    text, n = LISTEN.subn(rf"\g<1>listen 127.0.0.1:{listen_port}\g<2>", text)
    assert n == 1, "deploy/nginx.conf should have one `listen PORT http2;`"
    return text


def write_nginx(root: pathlib.Path, listen_port: int, replicas: list[str]) -> list[str]:
    """The rendered config under `root` (also nginx's prefix); the nginx command line."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "nginx.conf"
    conf.write_text(render_nginx(listen_port, replicas))
    return [nginx(), "-p", str(root), "-c", str(conf)]


def test_the_nginx_config_is_valid(tmp_path):
    """`nginx -t` on the shipped file, replicas pointed at loopback ports."""
    cmd = write_nginx(tmp_path, h.free_port(), ["127.0.0.1:1", "127.0.0.1:2"])
    conf = (tmp_path / "nginx.conf").read_text()
    assert "grpc_pass grpc://verifiers;" in conf
    assert re.search(r"grpc_next_upstream\s+error\s+timeout", conf)
    assert re.search(r"grpc_read_timeout\s+\d{4,}s", conf)  # an hour, not the default minute
    assert "client_max_body_size 0;" in conf  # a stream's blocks add up past 1 MB
    r = subprocess.run([*cmd, "-t"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "test is successful" in r.stderr


def test_the_envoy_config_parses_and_names_the_replicas():
    """Envoy is not installed here: the file is YAML, with the pieces the README promises."""
    (cfg,) = yaml.safe_load_all((DEPLOY / "envoy.yaml").read_text())
    (listener,) = cfg["static_resources"]["listeners"]
    (hcm,) = listener["filter_chains"][0]["filters"]
    hcm = hcm["typed_config"]
    assert hcm["@type"].endswith("HttpConnectionManager")
    (route,) = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert route["route"]["cluster"] == "verifiers"
    assert route["route"]["timeout"] == "0s"  # no deadline on a session's stream
    assert "unavailable" in route["route"]["retry_policy"]["retry_on"].split(",")
    (cluster,) = cfg["static_resources"]["clusters"]
    assert cluster["name"] == "verifiers"
    options = cluster["typed_extension_protocol_options"]
    (http,) = options.values()
    assert "http2_protocol_options" in http["explicit_http_config"]
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"]["service_name"] == "jaxspec.v1.Verifier"
    endpoints = [
        e["endpoint"]["address"]["socket_address"]
        for group in cluster["load_assignment"]["endpoints"]
        for e in group["lb_endpoints"]
    ]
    assert len(endpoints) >= 2
    assert all(e["address"] and e["port_value"] > 0 for e in endpoints)


def test_the_kubernetes_example_runs_the_real_flags():
    """Deployment + headless Service; the container's arguments parse with the verifier's own
    parser; probes are gRPC on the served port; the grace period outlasts the drain."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s.yaml").read_text()) if d]
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Deployment", "Service"}
    dep, svc = kinds["Deployment"], kinds["Service"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:3] == ["python", "-m", "verify"]
    args = build_parser().parse_args([*c["command"][3:], *map(str, c["args"])])
    assert args.command == "serve"
    assert args.host == "0.0.0.0"
    assert args.tenants is not None
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secrets = {v["name"] for v in pod["volumes"] if "secret" in v}
    assert any(args.tenants.startswith(mounts[s] + "/") for s in secrets)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == args.port, probe
    assert pod["terminationGracePeriodSeconds"] > args.drain_timeout_s
    assert dep["spec"]["selector"]["matchLabels"] == dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert args.port in {p["port"] for p in svc["spec"]["ports"]}


class _Reset(grpc.RpcError):
    """What grpc reports when nginx resets a stream whose replica died."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL

    def details(self) -> str:
        return "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))"


def test_a_stream_the_proxy_reset_is_resumed_not_failed():
    """nginx ends a stream whose replica died with RST_STREAM INTERNAL_ERROR: the client
    must read it as Unavailable (resume elsewhere), not as a verifier bug."""
    assert isinstance(error_from_rpc(_Reset()), Unavailable)


# The sessions through the proxy: modes, encodings and temperatures mixed.
CONFIGS = [
    h.config(prompt=(1, 2, 3, 4), max_new_tokens=32, mode="pipelined", seed=1),
    h.config(prompt=(9, 8, 7), max_new_tokens=32, mode="sync", encoding="sparse", seed=2),
    h.config(prompt=(4, 4), max_new_tokens=32, encoding="onehot", temperature=0.0, seed=3),
    h.config(prompt=(5, 6, 7), max_new_tokens=32, mode="sync", gamma=2, seed=4),
    h.config(prompt=(3, 1, 4, 1, 5), max_new_tokens=32, encoding="sparse", seed=5),
    h.config(prompt=(2, 7), max_new_tokens=32, temperature=0.0, seed=6),
]


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with status {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not listen on {port} in {timeout_s:.0f} s") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two replicas (tiny target, the gRPC tests' flags and tenants) and nginx in front."""
    root = tmp_path_factory.mktemp("deploy")
    target, draft = h.write_models(root)
    env = h.server_env(root / "jax-cache")
    tenants = h.write_tenants(root / "tenants.toml")  # the token must cross the proxy
    replicas = []
    try:
        for _ in range(2):  # both start at once, then both are waited for
            args = ["--checkpoint", str(target), *h.SERVER_FLAGS, "--tenants", str(tenants)]
            replicas.append(VerifierProcess(args, env=env).start())
        for r in replicas:
            r.wait_ready(180)
        port = h.free_port()
        cmd = write_nginx(root / "nginx", port, [r.address for r in replicas])
        log = (root / "nginx.log").open("w")
        proxy = subprocess.Popen(
            [*cmd, "-g", "daemon off;"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        try:
            wait_listening(port, proxy)
            yield dict(
                target=target, draft=draft, replicas=replicas, address=f"127.0.0.1:{port}",
                log=root / "nginx.log",
            )  # fmt: skip
        finally:
            proxy.terminate()  # nginx: fast shutdown, workers included
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
                proxy.wait()
            log.close()
    finally:
        for r in replicas:
            r.stop()


@pytest.fixture(scope="module")
def reference(fleet):
    """Each session's tokens from an in-process verifier on the same checkpoint."""
    config = SchedulerConfig(max_sessions=8, max_len=128, max_gamma=4)  # the servers' flags

    async def go():
        v = LocalVerifier(jaxspec.load(fleet["target"]), config)
        try:
            return await asyncio.gather(*(one(v, c) for c in CONFIGS))
        finally:
            await v.aclose()

    async def one(v, cfg):
        d = h.drafter(str(fleet["draft"]), cfg.draft.gamma, cfg.draft.encoding)
        return (await run_session(v, d, cfg, depth=2)).tokens

    return h.run(go())


def test_sessions_through_nginx_survive_a_replica_killed(fleet, reference):
    """SIGKILL one replica while sessions stream through nginx: the sessions it held resume
    through nginx on the other one, and every session ends with exactly the reference tokens."""
    victim = fleet["replicas"][0]
    kill = Fault(24, victim.kill)  # no drain, no goodbye

    async def go():
        kw = dict(token=h.TOKENS["alice"], resume_timeout_s=60)
        return await asyncio.gather(
            *(
                h.session(fleet["address"], fleet["draft"], c, on_event=kill.session(i), **kw)
                for i, c in enumerate(CONFIGS)
            )
        )

    traces = h.run(go())
    assert kill.happened and not victim.alive()
    assert [t.tokens for t in traces] == reference, fleet["log"].read_text()[-3000:]
    assert sum(t.resumes for t in traces) >= 1
    assert fleet["replicas"][1].alive()
