"""The OpenAI-compatible endpoint (`python -m edge serve`), driven by the real `openai` client.

One verifier (`python -m verify serve`, the shipped tiny target) and one edge server (a real
uvicorn on a loopback port, drafting with the shipped tiny draft) serve the whole module; the
requests keep to a few shapes (gamma 4, a short prompt, max_tokens 12 or 40) so that the
first compile of each is paid once. Checked: greedy and seeded text equal to `edge generate`'s
for the same prompt, chat, streaming (with usage), stop strings, concurrent requests, a client
that disconnects mid-stream (its verifier session is closed: the verifier's Stats drop back to
no session before the answer could have finished), bad fields (400 naming the field), the API
key (401) and the verifier's statuses mapped to HTTP ones.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st

import edge.__main__ as edge_main
import jaxspec
from edge.client import GrpcEndpoint
from edge.openai_api import FIELDS, NEUTRAL, ApiError, TextStream, parse_request, status_of
from edge.openai_server import Backend, create_app
from jaxspec.protocol import DraftSpec, ResourceExhausted, Unauthenticated, Unavailable
from tests.grpc_helpers import server_env
from verify.process import VerifierProcess

KEY = "sk-test-key"
MODEL = "tiny"
PROMPT = "def fib(n):"
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
READY = re.compile(r"jaxspec OpenAI endpoint serving \S+ on (http://\S+/v1)")
WAIT_S = 120.0  # first compiles on a loaded 2-core machine (tests/grpc_helpers.py)


# Sets the open-files limit, then execs the server (no preexec_fn: the test process has
# JAX's threads, and Python code between fork and exec could deadlock on their locks).
_LIMIT_FILES = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)


# Ctrl-C as in a terminal: a background test run's children inherit SIGINT ignored (an exec
# keeps that); this resets it, then becomes the server (no preexec_fn: JAX's threads and fork).
_SIGINT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


class HttpServer:
    """`python -m <module> serve ARGS` in a subprocess; `url` once its ready line appeared.
    `files`: the server's limit on open files (soft and hard), as a host may set it."""

    def __init__(
        self, module: str, args: list[str], env: dict[str, str], files: int | None = None
    ) -> None:
        command = [sys.executable, "-m", module, "serve", *args]
        if files is not None:
            command = [sys.executable, "-c", _LIMIT_FILES, str(files), *command]
        command = [sys.executable, "-c", _SIGINT_DEFAULT, *command]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = READY.search(line)
            if m and not self.ready.is_set():
                self.url = m.group(1)
                self.ready.set()
        self.ready.set()

    def wait(self, timeout: float) -> str:
        self.ready.wait(timeout)
        assert self.url is not None, "".join(self.lines)[-3000:]
        return self.url

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(verifier address, endpoint base URL, env, chat template, verifier pid): one verifier
    and one edge server."""
    root = tmp_path_factory.mktemp("openai")
    env = server_env(root / "jax-cache")
    template = root / "chat.jinja"
    template.write_text(TEMPLATE)
    flags = ["--max-sessions", "8", "--max-gamma", "4", "--max-len", "128", "--no-warmup"]
    verifier = VerifierProcess(["--checkpoint", "default", *flags], env=env)
    server = None
    try:
        verifier.start().wait_ready(180)
        server = HttpServer(
            "edge",
            [
                "--verifier", verifier.address, "--pair", "tiny", "--port", "0", "--api-key", KEY,
                "--served-model-name", MODEL, "--chat-template", str(template),
                "--max-new-tokens", "12", "--timeout-s", str(WAIT_S),
            ],
            dict(os.environ, **env),
        )  # fmt: skip
        yield verifier.address, server.wait(180), dict(os.environ, **env), template, verifier.pid
    finally:
        if server is not None:
            server.stop()
        verifier.stop()


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack[1], api_key=KEY, max_retries=0, timeout=WAIT_S)


def _stats(address: str) -> dict:
    async def ask():
        async with GrpcEndpoint(address, timeout_s=30) as ep:
            return await ep.stats()

    return asyncio.run(ask())


async def _until_committed(address: str, before: int) -> None:
    """Poll the verifier's Stats over one channel until tokens past `before` are committed."""
    async with GrpcEndpoint(address, timeout_s=30) as ep:
        deadline = time.monotonic() + WAIT_S
        while (await ep.stats())["tokens_committed"] <= before and time.monotonic() < deadline:
            await asyncio.sleep(0.001)


def _post(url: str, path: str, body: bytes, key: str | None = KEY) -> http.client.HTTPConnection:
    """A raw POST (no client library between the test and the server)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=WAIT_S)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", u.path + path, body, headers)
    return conn


def _edge_generate(capsys, address: str, *flags: str) -> str:
    """What `python -m edge generate` prints for PROMPT (its answer, the prompt's echo cut)."""
    argv = ["generate", "--verifier", address, "--pair", "tiny", "--prompt", PROMPT]
    argv += ["--max-new-tokens", "12"]
    capsys.readouterr()
    assert edge_main.main([*argv, "--timeout-s", str(WAIT_S), *flags]) == 0
    out = capsys.readouterr().out
    assert out.startswith(PROMPT) and out.endswith("\n")
    return out[len(PROMPT) : -1]


def test_same_text_as_edge_generate(stack, client, capsys):
    """Greedy: the endpoint's text is `edge generate`'s. Sampled with a seed: the same text
    each time (not `edge generate`'s for that seed: a server's first token is the verifier's
    own draw, `first_plain`, where `edge generate` drafts it)."""
    for flags, fields in (
        (["--temperature", "0"], {"temperature": 0}),
        (None, {"seed": 7}),
    ):
        if flags is None:
            want = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **fields)
            want = want.choices[0].text
        else:
            want = _edge_generate(capsys, stack[0], *flags)
        got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **fields)
        assert got.choices[0].text == want, flags
        assert got.choices[0].finish_reason in ("stop", "length")
        assert got.usage.prompt_tokens > 0 and got.usage.completion_tokens <= 12
        assert got.usage.prompt_tokens_details.cached_tokens == 0
        figures = got.usage.model_extra["jaxspec"]
        assert 0 <= figures["acceptance_rate"] <= 1 and figures["tokens_per_round"] >= 1
        assert len(figures["accepted_per_position"]) == 4  # gamma 4


def test_streamed_completion_equals_whole(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    parts = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(parts)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_streamed_with_usage(client):
    """Chat through the chat template; a seeded stream gives the whole answer's text, and
    include_usage a last chunk with usage (the acceptance figures in usage.jaxspec)."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, seed=3)
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens <= 12  # the server's --max-new-tokens
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert chunks[-1].usage.model_extra["jaxspec"] == whole.usage.model_extra["jaxspec"]
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_cuts_the_text(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    text = whole.choices[0].text
    stop = text.strip()[2:5]
    assert stop and stop in text
    for stream in (False, True):
        got = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop], stream=stream
        )
        chunks = list(got) if stream else [got]
        assert "".join(c.choices[0].text for c in chunks) == text[: text.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_ignore_eos_makes_the_end_token_ordinary(client):
    """`ignore_eos` (what load tools send): an end token biased to come first ends the answer
    at once without it, and with it is drawn like any token until max_tokens ("length");
    streamed or not. The greedy tokens are the same up to where the end token stopped."""
    eos = jaxspec.load("default").config.eos_token_ids[0]
    bias = {"logit_bias": {str(eos): 100}, "temperature": 0}
    ended = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **bias)
    assert ended.usage.completion_tokens == 1 and ended.choices[0].finish_reason == "stop"
    for stream in (False, True):
        got = client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, stream=stream,
            stream_options={"include_usage": True} if stream else None,
            extra_body={"ignore_eos": True}, **bias,
        )  # fmt: skip
        chunks = list(got) if stream else [got]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        assert finish == "length" and chunks[-1].usage.completion_tokens == 12, stream
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": 1}
        )


def test_concurrent_requests(client):
    """Four requests at once, each its own session: each gives the text it gives alone."""

    def ask(seed: int) -> str:
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, seed=seed)
        return r.choices[0].text

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, range(4)))
    assert ask(2) == together[2]
    assert len(set(together)) > 1  # different seeds, different texts


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_ends_its_session(stack, stream):
    """A client that disconnects mid-answer (streamed: after its first chunk; whole: while it
    waits, tokens committed already) ends its session: the verifier holds no session after,
    having committed fewer tokens than the 40 asked for. The verifier is paused (SIGSTOP)
    from the first committed tokens until the client has gone, so the answer cannot finish
    first."""
    address, url, pid = stack[0], stack[1], stack[4]
    before = _stats(address)["tokens_committed"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "seed": 1, "stream": stream}
    conn = _post(url, "/completions", json.dumps(body).encode())
    try:
        if stream:
            r = conn.getresponse()  # answered once the first tokens are committed
            os.kill(pid, signal.SIGSTOP)
            assert r.status == 200
            first = next(line for line in r if line.startswith(b"data: "))
            assert json.loads(first[6:])["choices"][0]["text"]
        else:
            asyncio.run(_until_committed(address, before))
            os.kill(pid, signal.SIGSTOP)
        conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away
        conn.close()
        time.sleep(1.0)  # the endpoint notices and cancels the session
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + WAIT_S
    while (stats := _stats(address))["sessions"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats["sessions"] == 0
    assert 0 < stats["tokens_committed"] - before < 40


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"foo": 1}, "foo"),
        ({"n": 2}, "n=1"),
        ({"temperature": -1}, "temperature"),
        ({"logprobs": 2}, "logprobs"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"max_tokens": 1 << 40}, "max_tokens"),
        ({"logit_bias": {str(1 << 40): 1}}, "logit_bias"),
        ({"prompt": [1 << 40]}, "prompt"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_bad_fields_are_refused(client, fields, named):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, extra_body=fields)
    assert e.value.status_code == 400 and named in e.value.message


def test_bad_requests_and_auth(stack, client):
    url = stack[1]
    with pytest.raises(openai.BadRequestError, match="tool"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}])
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=12)
    # The verifier refuses a prompt + max_tokens over its --max-len 128: its INVALID_ARGUMENT
    # comes back as a 400 with its words.
    with pytest.raises(openai.BadRequestError, match="max length"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200)
    r = _post(url, "/completions", b"{").getresponse()
    assert r.status == 400 and "not JSON" in json.loads(r.read())["error"]["message"]
    # A lone UTF-16 surrogate (valid JSON, not text): a 400 naming it, streamed or not, in
    # a prompt, a message's content or name, never the tokenizer's 500.
    for path, body in (
        ("/completions", rb'{"prompt": "\ud800"}'),
        ("/completions", rb'{"prompt": "a\udfff", "stream": true}'),
        ("/chat/completions", rb'{"messages": [{"role": "user", "content": "\ud800"}]}'),
        ("/chat/completions", rb'{"messages": [{"role": "user", "content": "", "name": "\udc00"}]}'),  # noqa: E501
    ):  # fmt: skip
        r = _post(url, path, body[:-1] + b', "model": "' + MODEL.encode() + b'"}').getresponse()
        assert r.status == 400 and "surrogate" in json.loads(r.read())["error"]["message"], path
    wrong = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert _post(url, "/completions", b"{}", key=None).getresponse().status == 401
    assert [m.id for m in client.models.list()] == [MODEL]


def test_speculation_backs_off_under_load():
    """`Backend.draft_for_next`: the server's draft while at most `plain_past` requests are
    admitted, none (gamma 0) past that; without `plain_past` always the server's. `loaded`
    (what a running session's `drafts_off` asks, its own request not counted) likewise."""
    spec = DraftSpec(gamma=4)
    backend = Backend(endpoint=None, drafter=None, text_model=jaxspec.load("default"),
                      model_id=MODEL, draft=spec, plain_past=1)  # fmt: skip
    assert backend.draft_for_next() == spec and not backend.loaded()
    backend.admitted += 1
    assert backend.draft_for_next() == spec and not backend.loaded(own=1)
    backend.admitted += 1
    assert backend.draft_for_next() == DraftSpec(gamma=0) and not backend.loaded(own=1)
    backend.admitted += 1
    assert backend.loaded(own=1)  # a running session sees two others
    backend.plain_past = None
    assert backend.draft_for_next() == spec and not backend.loaded()


def test_status_mapping_and_parsing():
    """Pure functions: gRPC statuses -> HTTP statuses; fields checked; stop text held back."""
    assert status_of(ResourceExhausted("full")).status == 429
    assert status_of(Unavailable("gone")).status == 503
    assert status_of(Unauthenticated("token")).status == 401
    req = parse_request("chat", {"messages": [{"role": "user", "content": "x"}], "top_k": -1})
    assert req.sampling == {"top_k": 0}
    with pytest.raises(ApiError, match="max_completion_tokens"):
        parse_request("completion", {"prompt": "x", "max_tokens": 2, "max_completion_tokens": 3})
    pieces = {1: "ab", 2: "c", 3: "STO", 4: "P", 5: "zz"}
    s = TextStream(lambda ids: "".join(pieces[i] for i in ids), ["STOP"])
    s.feed([1, 2])
    assert s.take() == "abc"
    s.feed([3])
    assert s.take() == ""  # "STO" may become "STOP": held back
    s.feed([4, 5])
    assert s.stopped and s.take(final=True) == "" and s.text == "abc" and s.tokens == [1, 2, 3, 4]
    s = TextStream(lambda ids: "".join(pieces[i] for i in ids), ["STOP"])
    s.feed([3, 5])
    assert s.take() == "STOzz" and not s.stopped


def test_colocated_jaxspec_serve_gives_the_same_text(stack, client):
    """`jaxspec serve` (target and draft in one process, no verifier service): the same app,
    the same tokens as the edge endpoint in front of the verifier."""
    env, template = stack[2], stack[3]
    flags = ["--port", "0", "--max-len", "128", "--max-sessions", "8", "--longest-block", "4"]
    flags += ["--pair", "tiny"]  # (by default it serves SmolLM2, like the service commands)
    server = HttpServer("jaxspec_apps.cli", [*flags, "--chat-template", str(template)], env)
    try:
        local = openai.OpenAI(base_url=server.wait(180), api_key="-", max_retries=0, timeout=WAIT_S)
        for fields in ({"temperature": 0}, {"seed": 7}):
            want = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, **fields)
            got = local.completions.create(model="default", prompt=PROMPT, max_tokens=12, **fields)
            assert got.choices[0].text == want.choices[0].text
            assert got.usage.model_extra["jaxspec"] == want.usage.model_extra["jaxspec"]
        # Under load (its default --speculative-disable-by-batch-size 0): a request that
        # arrives while another runs decodes plainly, drafting nothing.
        long = iter(local.completions.create(model="default", prompt=PROMPT, max_tokens=100,
                                             temperature=0, stream=True))  # fmt: skip
        next(long)  # its session runs
        busy = local.completions.create(model="default", prompt=PROMPT, max_tokens=12, seed=7)
        assert busy.usage.model_extra["jaxspec"]["draft_tokens"] == 0
        assert busy.usage.completion_tokens > 0 and list(long)
        alone = local.completions.create(model="default", prompt=PROMPT, max_tokens=12, seed=7)
        assert alone.usage.model_extra["jaxspec"]["draft_tokens"] > 0  # counted out again
    finally:
        server.stop()


def test_ctrl_c_ends_jaxspec_serve_with_one_line(stack):
    """SIGINT (a terminal's Ctrl-C) to a ready `jaxspec serve`: status 130 and one line, no
    traceback (uvicorn re-raises the signal it stopped on, which reached asyncio.run)."""
    flags = ["--port", "0", "--pair", "tiny", "--gamma", "0", "--max-len", "128"]
    server = HttpServer("jaxspec_apps.cli", [*flags, "--max-sessions", "2"], stack[2])
    try:
        server.wait(180)
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(30)
        log = "".join(server.lines)
        assert code == 130 and "Traceback" not in log, log[-3000:]
        assert "jaxspec serve: interrupted" in log, log[-3000:]
    finally:
        server.stop()


class _Refusing:
    """A `VerifierEndpoint` whose every open fails with `error` (set by the test)."""

    error: Exception = Unavailable("no verifier")

    async def open_session(self, config):
        raise self.error

    async def verify(self, block):
        raise AssertionError("no session was opened")

    async def close_session(self, session_id):
        pass


def test_verifier_statuses_become_http_statuses():
    """The verifier's refusals as the client sees them: RESOURCE_EXHAUSTED 429 (with
    Retry-After), UNAVAILABLE 503, UNAUTHENTICATED 401 (the app in this process, over a
    verifier that refuses every session)."""
    verifier = _Refusing()
    backend = Backend(endpoint=verifier, drafter=None, text_model=jaxspec.load("default"),
                      model_id=MODEL, draft=DraftSpec(gamma=0))  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(create_app(backend), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1"
        c = openai.OpenAI(base_url=url, api_key="-", max_retries=0)
        for error, status in (
            (ResourceExhausted("all 8 session slots are in use"), 429),
            (Unavailable("connection refused"), 503),
            (Unauthenticated("bad token"), 401),
        ):
            verifier.error = error
            with pytest.raises(openai.APIStatusError) as e:
                c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=True)
            assert e.value.status_code == status and str(error) in e.value.message
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        verifier.error = ResourceExhausted("full")
        r = _post(url, "/completions", json.dumps({"prompt": PROMPT}).encode()).getresponse()
        assert r.status == 429 and r.getheader("Retry-After") == "1"
        assert json.loads(r.read())["error"]["code"] == "resource_exhausted"
    finally:
        server.should_exit = True
        thread.join(30)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_fields = st.sampled_from([*FIELDS["chat"], "prompt", *NEUTRAL, "foo"])


@given(
    kind=st.sampled_from(["chat", "completion"]), body=st.dictionaries(_fields, _json, max_size=6)
)
@settings(max_examples=300)
def test_any_body_is_a_request_or_a_400(kind, body):
    """Whatever JSON a client sends, the parser answers an ApiRequest or a 400 ApiError,
    never another exception (which would be a 500)."""
    try:
        parse_request(kind, body)
    except ApiError as e:
        assert e.status == 400 and str(e)
