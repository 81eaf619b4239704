"""The OpenAI-compatible HTTP endpoint: an ASGI app (FastAPI) in front of edge sessions,
served by uvicorn with bounds of its own (docs/service.md, "An OpenAI-compatible endpoint").

    GET  /v1/models              the one model served
    POST /v1/chat/completions    messages through the model's chat template
    POST /v1/completions         a text prompt (or token ids)

Each request runs its own `EdgeSession` against the backend's `VerifierEndpoint` (a
`GrpcEndpoint` for `python -m edge serve`, an in-process `LocalVerifier` for `jaxspec
serve`), so requests run concurrently and each is the target's distribution exactly, the same
tokens as `edge generate` gives for the same prompt, settings and seed. A client that goes
away (mid-stream or while waiting for a whole answer) cancels its session at once, which ends
its stream to the verifier (`GrpcEndpoint.close_session` from a cancelled task: no waiting
for blocks in flight). The request/answer shapes are `edge.openai_api`'s pure functions.

Every request is bounded before work is spent on it (`HttpLimits`): its head must arrive
within `header_timeout_s` (`GuardedH11Protocol`: uvicorn keeps a silent connection open
forever), its body within `body_timeout_s` and `max_body_bytes` (408, 413), at most
`max_connections` are open (the longest idle closed to make room), and its prompt must fit
the context (400) before a session opens. JSON decoding, checks and tokenizing run in a
worker thread, so a large request never stalls another's stream; every refusal, the HTTP
layer's own included, is OpenAI's error shape.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import hmac
import json
import os
import re
import resource
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge.adaptive import AdaptiveGamma
from edge.draft_pool import DraftPool
from edge.drafter import Drafter
from edge.openai_api import (
    ApiError,
    ApiRequest,
    TextStream,
    chunk,
    completion_body,
    finish_reason,
    parse_request,
    session_fields,
    status_of,
    usage,
)
from edge.openai_body import decode_body
from edge.session import EdgeSession
from jaxspec.ckpts.checkpoint import generation_defaults
from jaxspec.decoding.sampling import SEED_LIMIT
from jaxspec.nn.model import Model
from jaxspec.nn.text import chat_prompt, decode_text, encode_prompt
from jaxspec.protocol import DraftSpec, SessionConfig, VerifierEndpoint, VerifierError
from jaxspec_host.flags import add_max_new_tokens, is_loopback, port_arg
from jaxspec_host.worker import in_thread

COMMITS = ("accept", "correct", "bonus")  # session events that commit tokens
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's default
PING_S = 15.0  # an SSE comment line after this long without a token (proxies close idle streams)


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


@dataclasses.dataclass(kw_only=True)
class Backend:
    """What the app serves with: the verifier (shared by every session), the drafter, the
    model whose tokenizer and chat template encode prompts and decode answers, and the
    session settings the server was started with (the same for every request).
    `max_context` (positions, prompt + answer; None: the verifier alone decides) refuses a
    request that cannot fit before a session opens."""

    endpoint: VerifierEndpoint
    drafter: Drafter | None
    text_model: Model
    model_id: str
    draft: DraftSpec
    mode: str = "pipelined"
    depth: int = 2
    max_tokens: int = 256  # a chat request without max_tokens
    chat_defaults: Mapping[str, float] = dataclasses.field(default_factory=dict)
    resume_timeout_s: float = 0.0
    max_context: int | None = None
    reserved: int = 0  # positions past max_context each slot keeps for a draft block
    live: set[asyncio.Task] = dataclasses.field(default_factory=set)  # sessions running
    # The sessions' drafts batched in one draft call a round (None: each drafts alone).
    pool: DraftPool | None = None
    # vLLM's speculative_disable_by_batch_size: a request that arrives while more sessions
    # than this run decodes plainly (gamma 0); None: every request speculates.
    plain_past: int | None = None
    admitted: int = 0  # requests given a session and not finished (opening ones included)

    def loaded(self, own: int = 0) -> bool:
        """Whether more than `plain_past` requests besides the caller's `own` are admitted:
        a request arriving now (own 0) decodes plainly (gamma 0), and a speculating one (own
        1) stops drafting at its next block (docs/design.md: speculation under load).
        Counted from admission, not from a running session: a burst's requests are admitted
        before any of their sessions runs."""
        return self.plain_past is not None and self.admitted - own > self.plain_past

    def draft_for_next(self) -> DraftSpec:
        """The draft a request arriving now runs with: the server's, or none while `loaded`."""
        return DraftSpec(gamma=0) if self.loaded() else self.draft

    def __post_init__(self) -> None:
        tok = self.text_model.tokenizer
        # The most characters one token stands for: a text longer than this many times the
        # context cannot fit, whatever it tokenizes to (refused without tokenizing it).
        self.token_chars = max(map(len, tok.get_vocab()), default=1) if tok is not None else 0

    @property
    def stop_ids(self) -> frozenset[int]:
        """The end tokens that finish an answer as "stop" (the model's EOS ids)."""
        return frozenset(self.text_model.config.eos_token_ids)


class Generation:
    """One request's session, run as its own task; `pieces()` yields its text as it commits.

    `close()` cancels a session still running (the client went away, or a stop string ended
    the answer): the session's own `finally` closes it on the verifier, at once (a cancelled
    task does not wait for its blocks in flight)."""

    def __init__(self, backend: Backend, config: SessionConfig, stop: tuple[str, ...]):
        if config.draft.speculative:  # the load when it opens decides (Backend.plain_past)
            config = dataclasses.replace(config, draft=backend.draft_for_next())
        backend.admitted += 1
        self.counted = True  # in `backend.admitted` until `_leave`
        self.backend, self.config = backend, config
        self.text = TextStream(lambda ids: decode_text(backend.text_model, ids), stop)
        self.changed = asyncio.Event()
        policy = None
        if config.draft.adaptive:
            policy = AdaptiveGamma(config.draft.gamma, config.mode, backend.depth)
        self.session = EdgeSession(
            backend.endpoint,
            None if backend.pool is not None else backend.drafter,
            config,
            depth=backend.depth,
            on_event=self._on_event,
            resume_timeout_s=backend.resume_timeout_s,
            block_len=policy,
            pool=backend.pool,
            drafts_off=None if backend.plain_past is None else lambda: backend.loaded(own=1),
            first_plain=True,  # the first token as soon as plain decoding's (no draft prefill)
        )
        self.task: asyncio.Task | None = None
        self.seen = 0  # tokens of the trace fed to `text`
        self.closed = False

    def _on_event(self, kind: str, _tokens: tuple[int, ...]) -> None:
        if kind in COMMITS:
            self.changed.set()

    async def start(self) -> None:
        """Open the session and wait for its first tokens (or its end): an open that fails
        raises here, before any answer has started."""
        self.task = asyncio.ensure_future(self.session.run())
        self.backend.live.add(self.task)
        self.task.add_done_callback(self.backend.live.discard)
        self.task.add_done_callback(lambda _: self.changed.set())
        # a session whose client went away may fail with nobody to hear it: seen here
        self.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.task.add_done_callback(lambda _: self._leave())
        while not self.task.done() and not self.session.trace.tokens:
            await self.changed.wait()
            self.changed.clear()
        if self.task.done() and self.task.exception() is not None:
            raise self.task.exception()

    async def pieces(self, ping_s: float | None = None) -> AsyncIterator[str | None]:
        """The answer's text in pieces, as tokens commit, until the session finishes or a
        stop string appears; raises the session's error. With `ping_s`, None after each
        `ping_s` seconds without a piece."""
        while True:
            done = self.task.done()
            tokens = self.session.trace.tokens
            self.text.feed(tokens[self.seen :])
            self.seen = len(tokens)
            if self.text.stopped or done:
                if done and not self.text.stopped and self.task.exception() is not None:
                    raise self.task.exception()
                piece = self.text.take(final=True)
                if piece:
                    yield piece
                return
            piece = self.text.take()
            if piece:
                yield piece
            self.changed.clear()
            try:
                async with asyncio.timeout(ping_s):
                    await self.changed.wait()
            except TimeoutError:
                yield None

    def close(self) -> None:
        """Cancel the session if it still runs (its task closes it on the verifier); once: a
        second cancel would cut that close short."""
        if self.task is not None and not self.task.done() and not self.closed:
            self.closed = True
            self.task.cancel()
            _BACKGROUND.add(self.task)
            self.task.add_done_callback(_BACKGROUND.discard)
        elif self.task is None or self.task.done():
            self._leave()

    def _leave(self) -> None:
        """No longer counted as admitted (once)."""
        if self.counted:
            self.counted = False
            self.backend.admitted -= 1

    def finish(self) -> str:
        """The answer's `finish_reason`, once it ended ("stop" or "length")."""
        stops = self.config.stop_tokens
        stops = self.backend.stop_ids if stops is None else frozenset(stops)
        return finish_reason(self.text, self.config.max_new_tokens, stops)

    def usage(self) -> dict[str, Any]:
        """The answer's `usage`, with the acceptance figures (`usage.jaxspec`)."""
        return usage(len(self.config.prompt), len(self.text.tokens), self.session.trace.figures)


_BACKGROUND: set[asyncio.Task] = set()  # cancelled sessions, kept alive while they close


DISCONNECTED = object()  # what `_until_disconnect` returns when the client went away


async def _gone(receive: Callable[[], Awaitable[dict]]) -> None:
    """Return once the client has disconnected (its request body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work` unless the client disconnects first: then cancel it and return
    `DISCONNECTED` (a client that goes away does not keep a session running)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_gone(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else DISCONNECTED


class EventStream(Response):
    """A streamed answer as Server-Sent Events: `data: <event>` per string of `events`, a
    `: ping` comment per None. `on_end()` runs however the answer ends, at once: the events
    running out, an error, or the client going away (watched on `receive`, not left to the
    generator's finalization, which may come much later or never)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str | None], on_end: Callable[[], None]) -> None:
        self.status_code, self.background = 200, None
        self.events, self.on_end = events, on_end
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # nginx: pass each event on at once
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(_gone(receive))
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.on_end()
            for task in (sender, watcher):
                task.cancel()
            await asyncio.gather(sender, watcher, return_exceptions=True)
            await self.events.aclose()
        if sender.done() and not sender.cancelled() and sender.exception() is not None:
            raise sender.exception()

    async def _send_all(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for event in self.events:
            data = b": ping\n\n" if event is None else f"data: {event}\n\n".encode()
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _context_error(
    backend: Backend, req: ApiRequest, prompt: int, answer: int, *, at_least: bool = False
) -> ApiError:
    """The 400 of a request over the context: what it needs (`at_least`: a text's bound,
    from its length, not tokenized) against the context and, where the verifier keeps
    positions for a draft block, how many."""
    field = "messages" if req.kind == "chat" else "prompt"
    kept = (
        f" ({backend.max_context + backend.reserved} positions less {backend.reserved} kept "
        "for a draft block)"
        if backend.reserved
        else ""
    )
    need = f"at least {prompt + answer}" if at_least else f"{prompt + answer}"
    return ApiError(
        f"this model's context is {backend.max_context} tokens{kept}; the request needs "
        f"{need} ({'at least ' if at_least else ''}{prompt} in the {field}, {answer} for the "
        f"answer): shorten the {field} or lower max_tokens",
        param=field if req.max_tokens is None else "max_tokens",
        code="context_length_exceeded",
    )


def _prompt_ids(backend: Backend, req: ApiRequest) -> tuple[int, ...]:
    """The request's prompt as token ids (chat: through the model's chat template); token ids
    it names (prompt, logit_bias) checked against the vocabulary. A text that cannot fit the
    context whatever it tokenizes to is refused without being tokenized; ids by their
    count."""
    model = backend.text_model
    if backend.max_context and isinstance(req.prompt, tuple):
        if len(req.prompt) >= backend.max_context:
            raise _context_error(backend, req, len(req.prompt), req.max_tokens or 1)
    text = req.prompt if isinstance(req.prompt, str) else ""
    chars = sum(len(m["content"]) for m in req.messages) + len(text)
    if backend.max_context and backend.token_chars:
        if chars > backend.max_context * backend.token_chars:
            least = -(-chars // backend.token_chars)
            raise _context_error(backend, req, least, req.max_tokens or 1, at_least=True)
    if req.kind == "chat":
        if model.tokenizer is None or not getattr(model.tokenizer, "chat_template", None):
            raise ApiError(
                f"{model.name or 'this model'} has no chat template: use /v1/completions, or "
                "start the server with --chat-template FILE",
                param="messages",
            )
        try:
            return chat_prompt(model, list(req.messages))
        except Exception as e:  # the template's own error (jinja), e.g. a role it refuses
            raise ApiError(f"messages: the chat template refused them: {e}") from None
    vocab = model.config.vocab_size
    if any(t >= vocab for t, _ in req.sampling.get("logit_bias", ())):
        raise ApiError(f"logit_bias: token ids must be in [0, {vocab})", param="logit_bias")
    if isinstance(req.prompt, tuple):
        if any(t >= vocab for t in req.prompt):
            raise ApiError(f"prompt: token ids must be in [0, {vocab})", param="prompt")
        return req.prompt
    return encode_prompt(model, req.prompt)


def _config(backend: Backend, req: ApiRequest) -> SessionConfig:
    """The session a request runs (its seed drawn at random when it gave none), checked
    against the context: the prompt and max_tokens must fit; without max_tokens, the default
    is cut to what fits (as vLLM does)."""
    prompt = _prompt_ids(backend, req)
    default = backend.max_tokens if req.kind == "chat" else DEFAULT_COMPLETION_TOKENS
    room = None if backend.max_context is None else backend.max_context - len(prompt)
    if room is not None:
        if room < 1 or (req.max_tokens is not None and req.max_tokens > room):
            raise _context_error(backend, req, len(prompt), req.max_tokens or 1)
        default = min(default, room)
    fields = session_fields(
        req,
        defaults=backend.chat_defaults,
        max_tokens=default,
        seed=secrets.randbelow(SEED_LIMIT),
    )
    return SessionConfig(prompt=prompt, mode=backend.mode, draft=backend.draft, **fields)


def _prepare(backend: Backend, kind: str, raw: bytes) -> tuple[ApiRequest, SessionConfig]:
    """A request's bytes -> (the checked request, its session): decoding, checks, the chat
    template and tokenizing, all CPU work (run in a worker thread, off the event loop)."""
    req = parse_request(kind, decode_body(raw))
    if req.model not in (None, backend.model_id):
        raise ApiError(
            f"model {req.model!r} is not served here (this server serves {backend.model_id!r})",
            status=404,
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    return req, _config(backend, req)


async def _read_body(request: Request, limits: HttpLimits) -> bytes:
    """The request's body: 413 past `max_body_bytes` (by its Content-Length, unread, or as
    it arrives), 408 when it has not all arrived within `body_timeout_s`."""
    limit = limits.max_body_bytes
    too_large = ApiError(
        f"the request body is over {limit} bytes (--max-body-bytes)",
        status=413,
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise too_large
    parts, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise too_large
                parts.append(part)
    except TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {limits.body_timeout_s:g} s",
            status=408,
            code="request_timeout",
        ) from None
    except ClientDisconnect:
        raise ApiError("the client went away before its body arrived") from None
    return b"".join(parts)


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    if e.status in (408, 413):  # the rest of the body is not read: end the connection
        headers = {"Connection": "close"}
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _failure(e: BaseException) -> ApiError:
    """The `ApiError` for whatever ended a session."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, VerifierError):
        return status_of(e)
    return ApiError(f"{type(e).__name__}: {e}", status=500, type="server_error")


def _explained(e: ApiError, req: ApiRequest, config: SessionConfig) -> ApiError:
    """`e`, saying where max_tokens came from when the request gave none and the verifier
    found the answer too long for it."""
    if e.status == 400 and req.max_tokens is None and "max_new_tokens" in str(e):
        why = f"{e} (the request gave no max_tokens: {config.max_new_tokens} was used; give one)"
        return ApiError(why, status=400, type=e.type, param="max_tokens", code=e.code)
    return e


async def _stream(
    gen: Generation, req: ApiRequest, rid: str, model: str
) -> AsyncIterator[str | None]:
    """The SSE `data:` payloads of a streamed answer (None: a ping), `[DONE]` last; an error
    mid-stream is sent as an `{"error": ...}` payload."""
    created = int(time.time())
    try:
        if req.kind == "chat":
            yield json.dumps(chunk(req, rid, created, model, None))
        try:
            async for piece in gen.pieces(PING_S):
                yield None if piece is None else json.dumps(chunk(req, rid, created, model, piece))
        except Exception as e:
            yield json.dumps(_failure(e).body())
            yield "[DONE]"
            return
        yield json.dumps(chunk(req, rid, created, model, "", gen.finish()))
        if req.include_usage:
            yield json.dumps(chunk(req, rid, created, model, None, use=gen.usage()))
        yield "[DONE]"
    finally:
        gen.close()


async def _whole(gen: Generation) -> str:
    return "".join([piece async for piece in gen.pieces()])


async def _complete(
    backend: Backend, request: Request, kind: str, key: bytes | None, limits: HttpLimits
) -> Response:
    """One request: check it (off the event loop), open its session, then stream or wait for
    the whole answer."""
    _check_key(request, key)
    raw = await _read_body(request, limits)
    req, config = await asyncio.to_thread(_prepare, backend, kind, raw)
    gen = Generation(backend, config, req.stop)
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
    try:
        if await _until_disconnect(request, gen.start()) is DISCONNECTED:
            gen.close()
            return Response(status_code=499)  # nobody reads it: the client is gone
        if req.stream:
            return EventStream(_stream(gen, req, rid, backend.model_id), gen.close)
        text = await _until_disconnect(request, _whole(gen))
    except Exception as e:
        gen.close()
        return _error(_explained(_failure(e), req, gen.config))
    except BaseException:
        gen.close()
        raise
    gen.close()
    if text is DISCONNECTED:
        return Response(status_code=499)
    body = completion_body(
        req, rid, int(time.time()), backend.model_id, text, gen.finish(), gen.usage()
    )
    return JSONResponse(body)


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


def _check_key(request: Request, key: bytes | None) -> None:
    """401 unless the request carries exactly one `Authorization: Bearer <key>` (when a key
    is set; compared as bytes, so any header byte is just a wrong key)."""
    if key is None:
        return
    values = [v for k, v in request.scope["headers"] if k == b"authorization"]
    why = "missing or wrong API key (Authorization: Bearer <key>)"
    if len(values) > 1:
        why = f"{len(values)} Authorization headers (send exactly one)"
    scheme, _, token = (values[0] if values else b"").partition(b" ")
    if (
        len(values) != 1
        or scheme.lower() != b"bearer"
        or not hmac.compare_digest(token.strip(), key)
    ):
        raise ApiError(why, status=401, type="authentication_error", code="invalid_api_key")


def create_app(
    backend: Backend, *, api_key: str | None = None, limits: HttpLimits | None = None
) -> FastAPI:
    """The ASGI app serving `backend`; with `api_key`, every /v1 route wants exactly one
    `Authorization: Bearer <api_key>` (401 otherwise). `limits`: the body's bounds."""
    limits = limits or HttpLimits()
    key = None if api_key is None else check_api_key(api_key).encode()
    app = FastAPI(title="jaxspec", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, e: ApiError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(VerifierError)
    async def verifier_error(_request: Request, e: VerifierError) -> JSONResponse:
        return _error(status_of(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(ApiError(str(e.detail), status=e.status_code, type=kind))

    @app.exception_handler(Exception)
    async def bug(_request: Request, e: Exception) -> JSONResponse:  # logged by uvicorn too
        return _error(ApiError(f"internal error: {type(e).__name__}", status=500,
                               type="server_error"))  # fmt: skip

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        """200 while the endpoint serves (no key needed, as load balancers ask); with the
        key, also its live sessions (and, co-located, the verifier's)."""
        try:
            _check_key(request, key)
        except ApiError:
            return {"status": "ok"}
        out = {"status": "ok", "sessions": len(backend.live)}
        scheduler = getattr(backend.endpoint, "scheduler", None)
        if scheduler is not None:
            out["verifier_sessions"] = len(scheduler.sessions)
        return out

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _check_key(request, key)
        card = {
            "id": backend.model_id,
            "object": "model",
            "created": started,
            "owned_by": "jaxspec",
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(backend, request, "chat", key, limits)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(backend, request, "completion", key, limits)

    return app


# -- the HTTP server: uvicorn's h11 protocol with the endpoint's own bounds ------------------

FD_RESERVE = 128  # files kept for what is not a client connection (models, gRPC, logs)
# uvicorn's backlog: the kernel's queue of connections not yet accepted, and how many asyncio
# accepts at one wake-up, before any of them is seen (uvicorn's 2,048 ran a 1,024-file
# process out of files mid-batch: accepting then stopped for a second at a time). The cap on
# open connections leaves room for two batches in flight.
ACCEPT_BATCH = 128
LINGER_S = 2.0  # a closing connection reads (and drops) what the client still sends this long


class LingeringTransport:
    """A connection's transport whose `close()` lingers: it sends what is buffered, ends our
    side (`write_eof`), then drops what the client still sends until it closes or `LINGER_S`
    passes. A plain close with the request's body unread (a 413 answered from the
    Content-Length alone) resets the connection, and a client still sending can lose the
    answer and retry. Everything else is the transport's own."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport, self.loop = transport, loop
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self.transport.is_closing()

    def close_now(self) -> None:
        """Close without lingering (nothing of the client's is left to read)."""
        self.lingering = True
        self.transport.close()

    def close(self) -> None:
        if self.is_closing():
            return
        self.lingering = True
        try:
            self.transport.write_eof()
            self.transport.resume_reading()
        except (NotImplementedError, RuntimeError, OSError):  # TLS has no half-close
            self.transport.close()
            return
        self.loop.call_later(LINGER_S, self.transport.close)


def _raw_error(status: int, e: ApiError) -> bytes:
    """A whole HTTP/1.1 answer (the connection then closes) for the protocol layer, which
    answers before or outside any request h11 could pair it with."""
    body = json.dumps(e.body()).encode()
    reason = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
              503: b"Service Unavailable"}  # fmt: skip
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason[status])
    return head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


_HEAD_END = re.compile(rb"\n\r?\n")  # the blank line that ends a head (h11 takes bare \n too)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol (one per connection) with the endpoint's bounds (`limits`): a
    request's head must arrive within `header_timeout_s` of the connection opening or of the
    previous answer (uvicorn alone keeps a silent or byte-a-minute connection open forever);
    past `max_open` connections the one idle longest is closed (503 for the new one when
    none is idle); a malformed request is answered in OpenAI's error shape; a connection
    closes lingering (`LingeringTransport`)."""

    limits = HttpLimits()
    max_open = HttpLimits().max_connections

    def connection_made(self, transport: Any) -> None:
        super().connection_made(LingeringTransport(transport, self.loop))
        self.idle_since = self.loop.time()
        self.head_deadline: asyncio.TimerHandle | None = None
        self._await_head()
        if len(self.connections) > self.max_open:
            self._make_room()

    def waiting(self) -> bool:
        """Whether the connection waits for a request (none, or part of one's head)."""
        answering = self.cycle is not None and not self.cycle.response_complete
        return self.conn.their_state is h11.IDLE and not answering

    def _make_room(self) -> None:
        open_ = [p for p in self.connections if not p.transport.is_closing()]
        if len(open_) <= self.max_open:
            return
        idle = [p for p in open_ if p is not self and getattr(p, "waiting", bool)()]
        if idle:
            min(idle, key=lambda p: p.idle_since).transport.close_now()
            return
        why = f"the endpoint is at its limit of {self.max_open} connections, none idle"
        err = ApiError(why, status=503, type="service_unavailable", code="too_many_connections")
        self.transport.write(_raw_error(503, err))
        self.transport.close()

    def _await_head(self) -> None:
        self._cancel_deadline()
        self.head_deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _cancel_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _head_late(self) -> None:
        """The head did not come in time: close (with a 408 if part of it came)."""
        self.head_deadline = None
        if self.transport.is_closing() or not self.waiting():
            return
        if not self.conn.trailing_data[0]:
            self.transport.close_now()  # nothing came: an idle connection
            return
        why = f"the request's head did not arrive within {self.limits.header_timeout_s:g} s"
        self.transport.write(_raw_error(408, ApiError(why, status=408, code="request_timeout")))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            return  # closing: what the client still sends is dropped
        if self.waiting() and self._head_too_long(data):
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_deadline()  # the head is in: the body has the app's deadline

    def _head_too_long(self, data: bytes) -> bool:
        """Answer 431 and close when the head being received (what h11 holds of it and
        `data`) is over `max_header_bytes`: h11 bounds only a head that is still incomplete,
        so one that came whole in a single read passed at any size."""
        held = bytes(self.conn.trailing_data[0])
        limit = self.limits.max_header_bytes
        if len(held) + len(data) <= limit or _HEAD_END.search(held + data, 0, limit):
            return False  # whole within the limit, or ends within it
        why = f"the request's head is over {limit} bytes (request line and headers)"
        err = ApiError(why, status=431, code="request_header_fields_too_large")
        self.transport.write(_raw_error(431, err))
        self.transport.close()
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.idle_since = self.loop.time()
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        why = (
            "invalid HTTP request: malformed, or a head over "
            f"{self.limits.max_header_bytes} bytes ({msg})"
        )
        body = json.dumps(ApiError(why, code="invalid_http").body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        try:
            out = self.conn.send(
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            )
            out += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
            self.transport.write(out)
        except h11.LocalProtocolError:
            pass  # an answer had begun: closing is all that is left
        self.transport.close()


def open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (a common soft
    default, 1,024, is a few idle connections' worth) and return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def http_server(app: FastAPI, host: str, port: int, limits: HttpLimits) -> uvicorn.Server:
    """uvicorn serving `app` with `limits` (`GuardedH11Protocol`); `max_connections` is
    lowered to what the file limit leaves, `FD_RESERVE` files kept, and a line says so."""
    files = open_files_limit()
    max_open = max(16, min(limits.max_connections, files - FD_RESERVE - 2 * ACCEPT_BATCH))
    if max_open < limits.max_connections:
        print(
            f"the OpenAI endpoint: at most {max_open} connections (the process may open {files} "
            f"files; --max-connections {limits.max_connections})",
            file=sys.stderr,
            flush=True,
        )
    protocol = type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "max_open": max_open}
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=protocol,
        ws="none",
        backlog=ACCEPT_BATCH,
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )
    return uvicorn.Server(config)


def ready_line(model_id: str, host: str, port: int) -> str:
    """The line a server prints once it listens (tests and scripts wait for it)."""
    return f"jaxspec OpenAI endpoint serving {model_id} on http://{host}:{port}/v1"


async def serve_app(
    app: FastAPI, host: str, port: int, model_id: str, limits: HttpLimits | None = None
) -> None:
    """Run `app` under uvicorn (`http_server`) in this event loop until SIGINT/SIGTERM; print
    `ready_line` (with the port bound: `port` 0 picks a free one) once it listens."""
    server = http_server(app, host, port, limits or HttpLimits())

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1]
        print(ready_line(model_id, host, bound), file=sys.stderr, flush=True)

    told = asyncio.ensure_future(announce())
    asyncio.get_running_loop().set_exception_handler(_quiet_out_of_files())
    try:
        await server.serve()
    finally:
        told.cancel()


def _quiet_out_of_files(every_s: float = 10.0) -> Callable[[Any, dict], None]:
    """The event loop's exception handler, with asyncio's "socket.accept() out of system
    resource" (a traceback per failed accept, thousands under a connection flood) said at
    most once per `every_s`, with how many were dropped."""
    last, dropped = [float("-inf")], [0]

    def handle(loop: Any, context: dict) -> None:
        if "out of system resource" in str(context.get("message", "")):
            now = time.monotonic()
            if now - last[0] < every_s:
                dropped[0] += 1
                return
            last[0] = now
            context = {**context, "message": f"{context['message']} ({dropped[0]} dropped)"}
            context.pop("exception", None)  # the traceback says nothing more
            dropped[0] = 0
        loop.default_exception_handler(context)

    return handle


# -- the command-line side, shared by `python -m edge serve` and `jaxspec serve` ------------


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


def with_chat_template(model: Model, template: str | None) -> Model:
    """`model` whose tokenizer uses `template` for chat (a copy: the loaded one is kept)."""
    if template is None or model.tokenizer is None:
        return model
    tok = copy.copy(model.tokenizer)
    tok.chat_template = template
    return dataclasses.replace(model, tokenizer=tok)


def _pool(
    drafter: Drafter | None, draft: DraftSpec, depth: int, max_context: int | None
) -> DraftPool | None:
    """The drafter's pool (None without speculation), its rows long enough for any request
    that fits `max_context` (a pool without it grows with the sessions' lengths)."""
    if drafter is None or not draft.speculative:
        return None
    if max_context is None:
        return DraftPool(drafter)
    return DraftPool(drafter, max_len=max_context + (depth + 1) * draft.gamma + 2)


async def serve_backend(
    args: argparse.Namespace,
    endpoint: VerifierEndpoint,
    drafter: Drafter | None,
    text_model: Model,
    draft: DraftSpec,
    *,
    max_context: int | None,
    reserved: int = 0,
) -> None:
    """Serve the endpoint the flags describe (`add_serve_flags`, checked by
    `check_serve_args`; `--mode --depth` and, where the command has it, `--resume-timeout-s`)
    over `endpoint` until SIGINT/SIGTERM: `text_model` (the target's tokenizer, `--chat-template`
    applied) encodes and decodes, each request a session drafting `draft` with `drafter`; the
    model served is `--checkpoint` (`--served-model-name` renames it), whose generation
    settings a chat takes where it gives none. `python -m edge serve` and `jaxspec serve`
    both serve through here."""
    backend = Backend(
        endpoint=endpoint,
        drafter=drafter,
        text_model=with_chat_template(text_model, args.chat_template_text),
        model_id=args.served_model_name or args.checkpoint,
        draft=draft,
        mode=args.mode,
        depth=args.depth,
        max_tokens=args.max_new_tokens,
        chat_defaults=generation_defaults(args.checkpoint),
        resume_timeout_s=getattr(args, "resume_timeout_s", 0.0),
        max_context=max_context,
        reserved=reserved,
        pool=_pool(drafter, draft, args.depth, max_context),
        plain_past=args.speculative_disable_by_batch_size,
    )
    if backend.pool is not None:
        # the draft call of every row bucket compiled before the endpoint says it is ready
        await in_thread(backend.pool.warm)
    app = create_app(backend, api_key=args.api_key, limits=args.http_limits)
    await serve_app(app, args.host, args.port, backend.model_id, args.http_limits)
