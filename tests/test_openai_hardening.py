"""The OpenAI-compatible endpoint under attack (issue 48): every attack of the issue, each a
test that failed on the code before it.

The module's servers: one verifier (`python -m verify serve`, the shipped tiny target), one
`python -m edge serve` in front of it whose open-files limit is 1,024 (a common default),
one `jaxspec serve` (co-located, the same app), and one endpoint in this process over a
`GrpcEndpoint` to the same verifier (so that the streams it holds can be counted, and with
short HTTP deadlines). The edge server reaches the verifier through a TCP relay that the last
test takes down and brings back. Raw sockets send what no client library would; the real
`openai` client sends what real clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxspec
from edge.client import GrpcEndpoint
from edge.drafter import load_drafter
from edge.http_guard import http_server
from edge.openai_api import ApiError, TextStream, parse_request, status_of
from edge.openai_body import decode_body
from edge.openai_server import Backend, create_app
from jaxspec.nn.text import decode_text
from jaxspec.protocol import DraftSpec, ResourceExhausted
from jaxspec_host.flags import HttpLimits
from tests.grpc_helpers import server_env
from tests.test_openai_api import KEY, MODEL, PROMPT, TEMPLATE, WAIT_S, HttpServer
from verify.process import VerifierProcess

FILES = 1024  # the edge server's open-files limit (soft and hard: it cannot raise it)
CAP = FILES - 128 - 2 * 128  # its connections at most (FD_RESERVE, two ACCEPT_BATCHes)
E_BYTES = (129, 104)  # the tiny tokenizer's two byte tokens of "é" (0xC3 0xA9)
ERROR_KEYS = {"message", "type", "param", "code"}


# -- the servers -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("openai-hardening")
    (path / "chat.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def env(root):
    return dict(os.environ, **server_env(root / "jax-cache"))


@pytest.fixture(scope="module")
def verifier(root):
    flags = ["--max-sessions", "24", "--max-gamma", "4", "--max-len", "128", "--no-warmup"]
    v = VerifierProcess(["--checkpoint", "default", *flags], env=server_env(root / "jax-cache"))
    try:
        v.start().wait_ready(180)
        yield v
    finally:
        v.stop()


class Relay:
    """A TCP relay on a loopback port to `target` ("host:port") that can go down: every
    connection it relays is cut and each new one accepted and closed at once (a verifier
    gone, its address still routed), its time kept in `attempts`; and come back."""

    def __init__(self, target: str) -> None:
        self.host, _, port = target.rpartition(":")
        self.port, self.down, self.attempts, self.relayed = int(port), False, [], []
        self.pipes: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.attempts.append(time.monotonic())
            writer.transport.abort()
            return
        self.relayed.append(time.monotonic())
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pipes.add(writer)
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            self.pipes.discard(writer)
            writer.transport.abort()

    def set_down(self, down: bool) -> None:
        def apply() -> None:
            self.down = down
            for writer in list(self.pipes) if down else ():
                writer.transport.abort()

        self.loop.call_soon_threadsafe(apply)


@pytest.fixture(scope="module")
def relay(verifier):
    return Relay(verifier.address)


@pytest.fixture(scope="module")
def edge(relay, root, env):
    """`python -m edge serve` with --api-key, at most 1,024 open files, reaching the
    verifier through `relay`."""
    server = HttpServer(
        "edge",
        [
            "--verifier", relay.address, "--pair", "tiny", "--port", "0", "--api-key", KEY,
            "--served-model-name", MODEL, "--chat-template", str(root / "chat.jinja"),
            "--max-new-tokens", "12", "--timeout-s", str(WAIT_S), "--resume-timeout-s", "4.5",
            "--header-timeout-s", "60",
        ],
        env,
        files=FILES,
    )  # fmt: skip
    try:
        server.wait(180)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(edge):
    return openai.OpenAI(base_url=edge.url, api_key=KEY, max_retries=0, timeout=WAIT_S)


class InProcess:
    """The endpoint in a thread of this process, over a `GrpcEndpoint` to `address`, with
    short HTTP deadlines (`limits`): `url`, `endpoint` (its streams can be counted)."""

    def __init__(self, address: str, limits: HttpLimits) -> None:
        spec = DraftSpec(gamma=4)
        self.drafter = load_drafter("default-draft", "w4a16", spec)
        self.address, self.limits, self.spec = address, limits, spec
        self.started = threading.Event()
        self.server = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.thread.start()
        assert self.started.wait(120), "the in-process endpoint did not start"

    async def _serve(self) -> None:
        self.endpoint = GrpcEndpoint(self.address, timeout_s=WAIT_S)
        backend = Backend(endpoint=self.endpoint, drafter=self.drafter,
                          text_model=self.drafter.model, model_id=MODEL, draft=self.spec,
                          max_context=512)  # fmt: skip
        app = create_app(backend, limits=self.limits)
        self.server = http_server(app, "127.0.0.1", 0, self.limits)
        serving = asyncio.ensure_future(self.server.serve())
        while not self.server.started and not serving.done():
            await asyncio.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        self.started.set()
        await serving
        await self.endpoint.aclose()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def local(verifier):
    server = InProcess(
        verifier.address, HttpLimits(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0)
    )
    try:
        yield server
    finally:
        server.stop()


# -- raw HTTP ----------------------------------------------------------------------------------


def _connect(url: str, timeout: float = WAIT_S) -> socket.socket:
    u = urllib.parse.urlsplit(url)
    return socket.create_connection((u.hostname, u.port), timeout=timeout)


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 answer (by its Content-Length, else to the close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            raise ConnectionError(f"closed without an answer: {data[:200]!r}")
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")), None)  # fmt: skip
    while length is None or len(body) < length:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    # A request the server split in two (a bare LF ending a header line) is answered twice:
    # the second answer may arrive in the same read; the first is the one asked about.
    return status, body if length is None else body[:length]


def _request(method: str, path: str, body: bytes = b"", headers: tuple[bytes, ...] = ()) -> bytes:
    """A request's bytes as written, with Content-Length and Connection: close."""
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: test", *headers]
    lines += [b"Content-Length: %d" % len(body), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _exchange(url: str, data: bytes) -> tuple[int, bytes]:
    with _connect(url) as sock:
        sock.sendall(data)
        return _read_answer(sock)


def _post(url: str, route: str, body: bytes, *headers: bytes) -> tuple[int, bytes]:
    path = urllib.parse.urlsplit(url).path + route
    auth = (b"Authorization: Bearer " + KEY.encode(), b"Content-Type: application/json")
    return _exchange(url, _request("POST", path, body, headers or auth))


def _openai_error(status: int, body: bytes) -> dict:
    """The error of a 4xx answer, checked to be OpenAI's shape."""
    assert 400 <= status < 500, (status, body[:300])
    err = json.loads(body)["error"]
    assert set(err) == ERROR_KEYS and isinstance(err["message"], str) and err["message"]
    return err


def _stats(address: str) -> dict:
    async def ask():
        async with GrpcEndpoint(address, timeout_s=30) as ep:
            return await ep.stats()

    return asyncio.run(ask())


def _wait_sessions(address: str, want: int = 0, deadline_s: float = 30.0) -> int:
    """Poll the verifier until it holds `want` sessions (or `deadline_s` passed, far below
    its 300 s idle eviction); the last count seen."""
    deadline = time.monotonic() + deadline_s
    while (n := _stats(address)["sessions"]) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


# -- malformed requests: a 4xx in OpenAI's shape, the endpoint still up ------------------------

NESTED_ARRAYS = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
NESTED_USER = b'{"prompt": "x", "user": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}"
LONG_NUMBER = b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"


@pytest.mark.parametrize(
    ("name", "body", "headers", "status"),
    [
        ("non-ASCII key", b'{"prompt": "x"}', (b"Authorization: Bearer sk-\xc3\xa9\xff",), 401),
        ("100k nested arrays", NESTED_ARRAYS, (), 400),
        ("5k nested objects in user", NESTED_USER, (), 400),
        ("5,000-digit max_tokens", LONG_NUMBER, (), 400),
        ("NaN", b'{"prompt": "x", "temperature": NaN}', (), 400),
        ("not UTF-8", b'{"prompt": "\xff\xfe"}', (), 400),
        ("two keys", b'{"prompt": "x"}', (b"Authorization: Bearer " + KEY.encode(),) * 2, 401),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_malformed_requests_get_openai_errors(edge, name, body, headers, status):
    """Each was a 500 (or, for two Authorization headers, the first one taken): now the
    status, in OpenAI's shape, and the endpoint answers the next request."""
    auth = (b"Authorization: Bearer " + KEY.encode(),)
    got, answer = _post(edge.url, "/completions", body, *(headers or auth))
    assert got == status, (name, answer[:300])
    _openai_error(got, answer)
    got, answer = _exchange(edge.url, _request("GET", "/v1/models", headers=auth))
    assert got == 200 and json.loads(answer)["data"][0]["id"] == MODEL


def test_malformed_http_and_models_route(edge):
    """A non-ASCII key on /v1/models (401, was a 500), garbage instead of HTTP (h11's 400,
    was plain text) and an unknown route: OpenAI's shape each time."""
    for data in (
        _request("GET", "/v1/models", headers=(b"Authorization: Bearer \xff\xfe",)),
        b"GARBAGE\r\n\r\n",
        _request("GET", "/v1/nothing", headers=(b"Authorization: Bearer " + KEY.encode(),)),
    ):
        _openai_error(*_exchange(edge.url, data))
    # A head over the documented 16 KiB (HttpLimits.max_header_bytes) is refused with 431
    # however it arrives: whole in one write (h11 bounds only an incomplete head), or with
    # the blank line that ends it in the next; one just under it is served.
    path = urllib.parse.urlsplit(edge.url).path + "/models"
    auth = b"Authorization: Bearer " + KEY.encode()
    for size in (100 << 10, 17 << 10):
        big = _request("GET", path, headers=(auth, b"X-Pad: " + b"a" * size))
        status, body = _exchange(edge.url, big)
        assert status == 431 and "head is over 16384" in _openai_error(status, body)["message"]
    under = _request("GET", path, headers=(auth, b"X-Pad: " + b"a" * (15 << 10)))
    assert _exchange(edge.url, under)[0] == 200
    with _connect(edge.url) as split:
        head = _request("GET", path, headers=(auth, b"X-Pad: " + b"a" * (17 << 10)))
        split.sendall(head[:-3])
        time.sleep(0.2)
        split.sendall(head[-3:])
        assert _read_answer(split)[0] in (400, 431)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300)
    | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                              max_size=3),
    max_leaves=10,
)  # fmt: skip
_fields = st.sampled_from(
    ["prompt", "messages", "max_tokens", "temperature", "stop", "stream", "seed", "user",
     "logit_bias", "response_format", "stream_options", "n", "logprobs", "name", "x"]
)  # fmt: skip
_token = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
                 min_size=1, max_size=12)  # fmt: skip
_header = st.tuples(_token, st.binary(max_size=24)).map(lambda h: h[0].encode() + b": " + h[1])


def _body(fields: dict, raw: bytes, nest: int, as_raw: bool) -> bytes:
    if as_raw:
        return raw
    body = json.dumps(fields, default=str).encode()
    return body if not nest else b"[" * nest + body + b"]" * nest


@given(
    route=st.sampled_from(["/completions", "/chat/completions", "/models"]),
    fields=st.dictionaries(_fields, _json, max_size=5),
    raw=st.binary(max_size=64),
    nest=st.sampled_from([0, 0, 0, 40, 5000]),
    as_raw=st.booleans(),
    headers=st.lists(_header, max_size=3),
    auth=st.sampled_from([b"Authorization: Bearer " + KEY.encode(), b"Authorization: \xff"]),
)
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_bodies_and_headers_never_a_500(edge, route, fields, raw, nest, as_raw, headers,
                                                auth):  # fmt: skip
    """Hypothesis-drawn bodies (JSON of the API's fields with any values, deep nesting,
    huge numbers, raw bytes) and headers (any bytes) against the running endpoint: an answer
    (200) or a 4xx in OpenAI's shape, never a 500, never a dropped connection."""
    if "max_tokens" in fields:  # keep an answer short when the request is a valid one
        fields["max_tokens"] = 4
    method = "GET" if route == "/models" else "POST"
    data = _request(method, "/v1" + route, _body(fields, raw, nest, as_raw), (auth, *headers))
    status, body = _exchange(edge.url, data)
    if status >= 400:
        _openai_error(status, body)
    else:
        assert status == 200


# -- fields real clients send ------------------------------------------------------------------


def test_fields_real_clients_send_are_accepted(client):
    """`name` on messages (the SDK's typed messages, LangChain's HumanMessage(name=)), an
    assistant message read back from an answer (refusal, tool_calls null), response_format
    text, user, stream_options, logprobs false and the other fields that ask for nothing
    jaxspec lacks: answered (each was a 400)."""
    messages = [
        {"role": "system", "content": "Be brief.", "name": "setup"},
        {"role": "user", "content": "Hi", "name": "alice"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": None},
        {"role": "user", "content": [{"type": "text", "text": "Again"}], "name": "alice"},
    ]
    extra = {
        "response_format": {"type": "text"}, "user": "u-1", "logprobs": False,
        "top_logprobs": None, "store": False, "service_tier": "auto",
        "parallel_tool_calls": False, "tool_choice": "none", "safety_identifier": "s-1",
        "prompt_cache_key": "k", "modalities": ["text"], "metadata": {"app": "test"},
    }  # fmt: skip
    extra = {"extra_body": extra}
    whole = client.chat.completions.create(model=MODEL, messages=messages, seed=3, **extra)
    assert whole.choices[0].message.content is not None
    parts = client.chat.completions.create(
        model=MODEL, messages=messages, seed=3, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, **extra,
    )  # fmt: skip
    chunks = list(parts)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_json_response_formats_refused_clearly(client):
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], response_format=fmt
            )
        assert "does not constrain its output to JSON" in e.value.message
        assert e.value.body["param"] == "response_format"


# -- stop strings over byte tokens -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_made_of_byte_tokens(client, stream):
    """Only é's two byte tokens allowed (logit_bias): `stop=["é"]` ends the answer before the
    first é, finish_reason "stop" (it ran to "length" with é in the text)."""
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, seed=5, temperature=1.0, stop=["é"],
        logit_bias={str(t): 100 for t in E_BYTES}, stream=stream,
    )  # fmt: skip
    chunks = list(got) if stream else [got]
    text = "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "é" not in text


def _cut(text: str, stops: list[str]) -> str:
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return text[: min(hits)] if hits else text


class _Eager(TextStream):
    """The mutant: text taken as each token decodes, an unfinished character's U+FFFD
    included (what the endpoint did), so a character split over tokens never matches."""

    def _advance(self, final: bool) -> None:
        done = self.decode(self.tokens[: self.read]) if self.read else ""
        full = self.decode(self.tokens)
        self.read = len(self.tokens)
        self._append(full[len(done) :] if full.startswith(done) else "")


def _streamed(cls: type[TextStream], decode, tokens: list[int], stops: list[str]) -> str:
    s, out = cls(decode, stops), ""
    for t in tokens:
        s.feed([t])
        out += s.take()
    return out + s.take(final=True)


@pytest.fixture(scope="module")
def tiny_decode():
    model = jaxspec.load("default-draft")
    return lambda ids: decode_text(model, ids)


_tokens = st.lists(st.sampled_from([*E_BYTES, *E_BYTES, 222, 610, 71, 1, 300, 3000]),
                   max_size=24)  # fmt: skip


def test_stop_strings_match_however_tokens_split_the_text(tiny_decode):
    """A property over token sequences of byte tokens, a split é among them: the streamed
    text equals the whole answer's decoded text cut before the first stop string; the
    mutant that takes each token's decoding at once (U+FFFD and all) fails it."""
    stops = st.lists(st.sampled_from(["é", "é ", "ca", "\n", "fé"]), min_size=1, max_size=3)

    @given(tokens=_tokens, stops=stops)
    @settings(max_examples=200, deadline=None, database=None)
    def check(cls, tokens, stops):
        want = _cut(tiny_decode(tokens), stops)
        assert _streamed(cls, tiny_decode, tokens, stops) == want

    check(TextStream)
    with pytest.raises(AssertionError):
        check(_Eager)


def test_stop_cut_before_the_stop_that_starts_first():
    pieces = {1: "xa", 2: "bcd", 3: "e"}
    s = TextStream(lambda ids: "".join(pieces[i] for i in ids), ["bcd", "ab"])
    s.feed([1, 2, 3])
    assert s.stopped and s.text == "x" and s.tokens == [1, 2]


# -- sizes: checked before any work, never 429 -------------------------------------------------


def test_request_size_refused_before_any_work(edge, verifier):
    """A 10 MB body: 413 from its Content-Length (read before the body is); a prompt that
    fits the body but not the context: 400 context_length_exceeded, without tokenizing or
    asking the verifier (it was tokenized, sent, refused by the verifier's message limit
    and answered 429, which the openai SDK retries)."""
    auth = (b"Authorization: Bearer " + KEY.encode(), b"Content-Type: application/json")
    head = _request("POST", "/v1/completions", b"", auth).replace(
        b"Content-Length: 0", b"Content-Length: %d" % (10 << 20)
    )
    with _connect(edge.url) as sock:  # the head alone: answered before any byte of body
        sock.sendall(head)
        err = _openai_error(*_read_answer(sock))
    assert err["code"] == "request_too_large"
    steps = _stats(verifier.address)["steps"]
    for prompt, needs in (("x " * 400_000, "at least"), ([7] * 300_000, "300001 (300000 in"),
                          ("word " * 600, "")):  # fmt: skip
        status, body = _post(edge.url, "/completions", json.dumps({"prompt": prompt}).encode())
        err = _openai_error(status, body)
        assert status == 400 and err["code"] == "context_length_exceeded", err
        assert f"the request needs {needs}" in err["message"], err  # ids counted, not chars
    assert _stats(verifier.address)["steps"] == steps
    big = openai.OpenAI(base_url=edge.url, api_key=KEY, timeout=WAIT_S)  # SDK's retries on
    with pytest.raises(openai.APIStatusError) as e:
        big.completions.create(model=MODEL, prompt="x" * (10 << 20), max_tokens=4)
    assert e.value.status_code == 413


def test_too_large_for_the_verifier_is_413_not_429():
    too_large = ResourceExhausted("Received message larger than max (7000061 vs. 131712)")
    assert status_of(too_large).status == 413
    assert status_of(ResourceExhausted("all 24 session slots are in use")).status == 429


# -- connections: idle, slow, many -------------------------------------------------------------


def test_idle_connections_do_not_lock_out_a_client(edge, client):
    """1,500 idle connections against a server that may open 1,024 files: a request is still
    answered (it waited for ever: accept failed with EMFILE), the longest-idle closed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1800:
        pytest.skip(f"this test process may open {hard} files; it needs 1,800")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1800), hard))
    idle = []
    try:
        for _ in range(1500):
            idle.append(_connect(edge.url, timeout=30))
        answer = client.with_options(timeout=60).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0
        )
        assert answer.choices[0].finish_reason in ("stop", "length")
        closed = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        assert closed >= 1500 + 1 - CAP  # past the cap, the longest idle were closed
    finally:
        for sock in idle:
            sock.close()
    assert any(f"at most {CAP} connections" in line for line in edge.lines)


def test_slow_and_silent_connections_are_closed(local):
    """Deadlines of 1 s (`HttpLimits`): a connection that sends nothing is closed; one that
    sends its head a byte at a time gets 408 and is closed; a body that does not come gets
    408 (uvicorn alone held each open for ever)."""
    with _connect(local.url, timeout=30) as silent:
        assert silent.recv(100) == b""
    with _connect(local.url, timeout=30) as slow:
        for byte in b"POST /v1/completions HTTP/1.1\r\n":
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
        assert _openai_error(*_read_answer(slow))["code"] == "request_timeout"
    with _connect(local.url, timeout=30) as no_body:
        no_body.sendall(_request("POST", "/v1/completions", b"").replace(
            b"Content-Length: 0", b"Content-Length: 100") + b'{"prompt"')  # fmt: skip
        status, body = _read_answer(no_body)
        assert status == 408 and _openai_error(status, body)["code"] == "request_timeout"


# -- clients that go away, bursts --------------------------------------------------------------


async def _go_away(
    url: str, stream: bool, seed: int, ready: asyncio.Event, leave: asyncio.Event
) -> None:
    """A client that sends a request, says `ready` (streamed: once its first tokens came),
    and disconnects on `leave`."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 100, "seed": seed, "stream": stream})
    writer.write(_request("POST", u.path + "/completions", body.encode(),
                          (b"Content-Type: application/json",)))  # fmt: skip
    while stream and not (await reader.readline()).startswith(b"data: {"):
        pass
    ready.set()
    await leave.wait()
    writer.transport.abort()


def test_clients_that_go_away_have_their_sessions_closed_at_once(local, verifier):
    """20 clients (streamed and whole) go away mid-answer while the verifier is stopped
    (SIGSTOP: it can answer nothing): the endpoint ends every one of their streams without
    it (it half-closed each and waited up to --timeout-s for the verifier to answer the
    blocks in flight, which a loaded verifier took seconds to do); resumed, the verifier
    holds no session."""

    async def run() -> int:
        ready = [asyncio.Event() for _ in range(20)]
        leave = asyncio.Event()
        clients = [
            asyncio.ensure_future(_go_away(local.url, i % 2 == 0, i, ready[i], leave))
            for i in range(20)
        ]
        await asyncio.gather(*(r.wait() for r in ready))  # each stream has its first tokens
        os.kill(verifier.pid, signal.SIGSTOP)
        held = local.endpoint.open_sessions
        leave.set()
        await asyncio.gather(*clients)
        return held

    try:
        held = asyncio.run(run())
        deadline = time.monotonic() + 30
        while local.endpoint.open_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held >= 10 and local.endpoint.open_sessions == 0
    finally:
        os.kill(verifier.pid, signal.SIGCONT)
    assert _wait_sessions(verifier.address) == 0


def test_bursts_past_the_verifiers_limit_leak_no_slot(edge, verifier):
    """Three bursts of 40 requests at a verifier of 24 slots, half of the clients gone at a
    random moment: the rest answered or 429 (with Retry-After, OpenAI's shape), and the
    verifier holds no session after (a leaked one stayed until its 300 s idle eviction)."""
    rng = random.Random(0)
    u = urllib.parse.urlsplit(edge.url)

    async def one(seed: int) -> int | None:
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        body = json.dumps({"prompt": PROMPT, "max_tokens": 30, "seed": seed}).encode()
        writer.write(_request("POST", u.path + "/completions", body,
                              (b"Authorization: Bearer " + KEY.encode(),)))  # fmt: skip
        if seed % 2:
            await asyncio.sleep(rng.uniform(0, 0.5))
            writer.transport.abort()
            return None
        answer = await reader.read()
        writer.close()
        status = int(answer.split(b" ", 2)[1])
        if status != 200:
            assert status == 429 and b"retry-after: 1" in answer.lower(), answer[:300]
            _openai_error(status, answer.partition(b"\r\n\r\n")[2])
        return status

    async def bursts() -> list:
        return [await asyncio.gather(*(one(40 * b + i) for i in range(40))) for b in range(3)]

    statuses = [s for burst in asyncio.run(bursts()) for s in burst if s is not None]
    assert 200 in statuses
    assert _wait_sessions(verifier.address) == 0
    # /health: "ok" to anyone (as load balancers ask), the live sessions with the key
    health = json.loads(_exchange(edge.url, _request("GET", "/health"))[1])
    assert health == {"status": "ok"}
    auth = (b"Authorization: Bearer " + KEY.encode(),)
    assert json.loads(_exchange(edge.url, _request("GET", "/health", headers=auth))[1]) == {
        "status": "ok", "sessions": 0}  # fmt: skip


# -- the API key at start ----------------------------------------------------------------------


@pytest.mark.parametrize(("module", "key"), [("edge", " "), ("edge", "kéy"), ("jaxspec", " ")])
def test_an_api_key_no_client_can_send_is_refused_at_start(env, module, key):
    """A blank key (no client can match it) or a non-ASCII one (every request was a 500):
    exit status 2 naming --api-key, before anything loads or connects."""
    args = ["--verifier", "localhost:1", "--resume-timeout-s", "0"] if module == "edge" else []
    target = "edge" if module == "edge" else "jaxspec_apps.cli"
    run = subprocess.run(
        [sys.executable, "-m", target, "serve", *args, "--pair", "tiny", "--api-key", key],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "--api-key" in run.stderr, run.stderr[-2000:]


# -- jaxspec serve: the same app, the same fixes -----------------------------------------------


def test_colocated_jaxspec_serve_has_the_same_fixes(root, env):
    """`jaxspec serve` shared the 500s and the stop-string miss: a non-ASCII key, deep
    nesting, a 5,000-digit number, a stop string of byte tokens and a prompt past the
    context, each answered as `python -m edge serve` answers it."""
    flags = ["--pair", "tiny", "--port", "0", "--max-len", "128", "--longest-block", "4"]
    flags += ["--api-key", KEY, "--chat-template", str(root / "chat.jinja")]
    server = HttpServer("jaxspec_apps.cli", flags, env)
    try:
        url = server.wait(180)
        bad = (b"Authorization: Bearer \xc3\xa9",)
        assert _post(url, "/completions", b'{"prompt": "x"}', *bad)[0] == 401
        assert _exchange(url, _request("GET", "/v1/models", headers=bad))[0] == 401
        for body in (NESTED_ARRAYS, NESTED_USER, LONG_NUMBER):
            status, answer = _post(url, "/completions", body)
            assert status == 400, answer[:300]
            _openai_error(status, answer)
        local = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=WAIT_S)
        got = local.completions.create(
            model="default", prompt=PROMPT, max_tokens=40, seed=5, temperature=1.0,
            stop=["é"], logit_bias={str(t): 100 for t in E_BYTES},
        )  # fmt: skip
        assert got.choices[0].finish_reason == "stop" and "é" not in got.choices[0].text
        with pytest.raises(openai.BadRequestError, match="context"):
            local.completions.create(model="default", prompt="word " * 200, max_tokens=4)
        # The context is --max-len less the positions a slot keeps for a draft block (gamma
        # 4 + 1), said in the refusal; ids are counted as ids (150,000 were 3,659 "chars").
        for ids, needs in (([7] * 120, "needs 124 (120 in"), ([7] * 150_000, "needs 150004")):
            with pytest.raises(openai.BadRequestError, match="context") as e:
                local.completions.create(model="default", prompt=ids, max_tokens=4)
            assert "123 tokens (128 positions less 5 kept for a draft block)" in e.value.message
            assert needs in e.value.message, e.value.message
    finally:
        server.stop()


# -- pure functions ----------------------------------------------------------------------------


def test_body_decoding_bounds():
    assert decode_body(b'{"a": [[1]]}') == {"a": [[1]]}
    for raw in (NESTED_ARRAYS, NESTED_USER, LONG_NUMBER, b"[NaN]", b"Infinity", b"\xff"):
        with pytest.raises(ApiError) as e:
            decode_body(raw)
        assert e.value.status == 400 and len(str(e.value)) < 200
    with pytest.raises(ApiError, match="nested deeper"):
        decode_body(b"[" * 40 + b"]" * 40)
    assert decode_body(rb'["\ud83d\ude00"]') == ["\U0001f600"]  # a pair is a character
    for raw in (rb'"\ud800"', rb'{"\udfff": 1}', rb'[[["x\ud83d"]]]'):
        with pytest.raises(ApiError, match="lone UTF-16 surrogate"):
            decode_body(raw)
    with pytest.raises(ApiError, match="finite"):
        parse_request("completion", {"prompt": "x", "temperature": 10**400})
    with pytest.raises(ApiError, match="logit_bias"):
        parse_request("completion", {"prompt": "x", "logit_bias": {"1": 10**400}})
    with pytest.raises(ApiError, match="stop"):
        parse_request("completion", {"prompt": "x", "stop": ["x" * 257]})


def test_harmless_fields_accepted_the_others_named():
    chat = {"messages": [{"role": "user", "content": "x", "name": "a"}]}
    req = parse_request("chat", {**chat, "response_format": {"type": "text"}, "user": "u",
                                 "logprobs": False, "stream": True,
                                 "stream_options": {"include_usage": True}})  # fmt: skip
    assert req.messages[0] == {"role": "user", "content": "x", "name": "a"}
    assert req.include_usage
    for field, value in (
        ("logprobs", True),
        ("response_format", {"type": "json_object"}),
        ("tools", [{"type": "function"}]),
        ("store", True),
        ("logprobs", 0),  # not false: JSON's 0 is not false
    ):
        with pytest.raises(ApiError) as e:
            parse_request("chat", {**chat, field: value})
        assert e.value.param == field and e.value.status == 400


# -- last: the verifier goes away and comes back -----------------------------------------------


def test_a_returning_verifier_is_reached_at_once(relay, client):
    """The verifier unreachable (the relay cuts its connections and refuses new ones) while
    requests keep coming (each a 503 after --resume-timeout-s 4.5), then back right after a
    reconnect attempt at least 10 s into the outage: a request sent at once is answered.
    gRPC's default backoff put the next attempt at least 5.24 s later (6.55 s or 10.5 s, less
    20% jitter), so every try of the request failed, a 503; capped at 1 s, the verifier is
    reached within about a second."""
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).choices
    relay.set_down(True)
    start, stop = time.monotonic(), threading.Event()

    def knock() -> None:  # traffic during the outage: the channel keeps trying to connect
        while not stop.is_set():
            with contextlib.suppress(openai.APIStatusError):
                client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)

    knocking = threading.Thread(target=knock, daemon=True)
    knocking.start()
    try:
        while not (relay.attempts and relay.attempts[-1] - start >= 10):
            assert time.monotonic() < start + 120, "no reconnect attempt 10 s into the outage"
            time.sleep(0.01)
        relay.set_down(False)
        back = time.monotonic()
        answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        answered = time.monotonic() - back
    finally:
        relay.set_down(False)
        stop.set()
        knocking.join(60)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(relay.attempts)]
    reached = min(t for t in relay.relayed if t >= back) - back
    print(f"attempts while down, s apart: {gaps}; the verifier reached {reached:.2f} s after "
          f"it was back, a request answered {answered:.2f} s after")  # fmt: skip
    assert answer.choices[0].finish_reason in ("stop", "length")
