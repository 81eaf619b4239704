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

Every request is bounded before work is spent on it: its head, body and connection by the
HTTP side (`edge.http_guard`, the bounds `HttpLimits` from the flags), and its prompt must fit
the context (400) before a session opens. JSON decoding, checks and tokenizing run in a
worker thread, so a large request never stalls another's stream; every refusal, the HTTP
layer's own included, is OpenAI's error shape. The flags are `jaxspec_host.flags.http`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge.adaptive import AdaptiveGamma
from edge.draft_pool import DraftPool
from edge.drafter import Drafter
from edge.http_guard import check_bearer, read_body, serve_app
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
from jaxspec_host.flags import HttpLimits, check_api_key
from jaxspec_host.worker import in_thread

COMMITS = ("accept", "correct", "bonus")  # session events that commit tokens
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's default
PING_S = 15.0  # an SSE comment line after this long without a token (proxies close idle streams)


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
    check_bearer(request, key)
    raw = await read_body(request, limits)
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
            check_bearer(request, key)
        except ApiError:
            return {"status": "ok"}
        out = {"status": "ok", "sessions": len(backend.live)}
        scheduler = getattr(backend.endpoint, "scheduler", None)
        if scheduler is not None:
            out["verifier_sessions"] = len(scheduler.sessions)
        return out

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_bearer(request, key)
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
