"""The OpenAI-compatible HTTP endpoint: an ASGI app (FastAPI, SSE by sse-starlette) in front
of edge sessions (docs/service.md, "An OpenAI-compatible endpoint").

    GET  /v1/models              the one model served
    POST /v1/chat/completions    messages through the model's chat template
    POST /v1/completions         a text prompt (or token ids)

Each request runs its own `EdgeSession` against the backend's `VerifierEndpoint` (a
`GrpcEndpoint` for `python -m edge serve`, an in-process `LocalVerifier` for `jaxspec
serve`), so requests run concurrently and each is the target's distribution exactly, the same
tokens as `edge generate` gives for the same prompt, settings and seed. A client that goes
away (mid-stream or while waiting for a whole answer) cancels its session, which closes it on
the verifier. The request/answer shapes are `edge.openai_api`'s pure functions.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import hmac
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge.adaptive import AdaptiveGamma
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
from edge.session import EdgeSession
from jaxspec.model import Model
from jaxspec.protocol import DraftSpec, SessionConfig, VerifierEndpoint, VerifierError
from jaxspec.sampling import SEED_LIMIT
from jaxspec.text import chat_prompt, decode_text, encode_prompt
from jaxspec_host.flags import add_max_new_tokens, port_arg

COMMITS = ("accept", "correct", "bonus")  # session events that commit tokens
DEFAULT_COMPLETION_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's default


@dataclasses.dataclass(kw_only=True)
class Backend:
    """What the app serves with: the verifier (shared by every session), the drafter, the
    model whose tokenizer and chat template encode prompts and decode answers, and the
    session settings the server was started with (the same for every request)."""

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

    @property
    def stop_ids(self) -> frozenset[int]:
        """The end tokens that finish an answer as "stop" (the model's EOS ids)."""
        return frozenset(self.text_model.config.eos_token_ids)


class Generation:
    """One request's session, run as its own task; `pieces()` yields its text as it commits.

    `close()` cancels a session still running (the client went away, or a stop string ended
    the answer): the session's own `finally` closes it on the verifier."""

    def __init__(self, backend: Backend, config: SessionConfig, stop: tuple[str, ...]):
        self.backend, self.config = backend, config
        self.text = TextStream(lambda ids: decode_text(backend.text_model, ids), stop)
        self.changed = asyncio.Event()
        policy = None
        if config.draft.adaptive:
            policy = AdaptiveGamma(config.draft.gamma, config.mode, backend.depth)
        self.session = EdgeSession(
            backend.endpoint,
            backend.drafter,
            config,
            depth=backend.depth,
            on_event=self._on_event,
            resume_timeout_s=backend.resume_timeout_s,
            block_len=policy,
        )
        self.task: asyncio.Task | None = None
        self.seen = 0  # tokens of the trace fed to `text`

    def _on_event(self, kind: str, _tokens: tuple[int, ...]) -> None:
        if kind in COMMITS:
            self.changed.set()

    async def start(self) -> None:
        """Open the session and wait for its first tokens (or its end): an open that fails
        raises here, before any answer has started."""
        self.task = asyncio.ensure_future(self.session.run())
        self.task.add_done_callback(lambda _: self.changed.set())
        while not self.task.done() and not self.session.trace.tokens:
            await self.changed.wait()
            self.changed.clear()
        if self.task.done() and self.task.exception() is not None:
            raise self.task.exception()

    async def pieces(self) -> AsyncIterator[str]:
        """The answer's text in pieces, as tokens commit, until the session finishes or a
        stop string appears; raises the session's error."""
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
            await self.changed.wait()

    def close(self) -> None:
        """Cancel the session if it still runs (its task closes it on the verifier)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            _BACKGROUND.add(self.task)
            self.task.add_done_callback(_BACKGROUND.discard)

    def finish(self) -> str:
        """The answer's `finish_reason`, once it ended ("stop" or "length")."""
        return finish_reason(self.text, self.config.max_new_tokens, self.backend.stop_ids)

    def usage(self) -> dict[str, Any]:
        """The answer's `usage`, with the acceptance figures (`usage.jaxspec`)."""
        return usage(len(self.config.prompt), len(self.text.tokens), self.session.trace.figures)


_BACKGROUND: set[asyncio.Task] = set()  # cancelled sessions, kept alive while they close


DISCONNECTED = object()  # what `_until_disconnect` returns when the client went away


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work` unless the client disconnects first: then cancel it and return
    `DISCONNECTED` (a client that goes away does not keep a session running)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else DISCONNECTED


def _prompt_ids(backend: Backend, req: ApiRequest) -> tuple[int, ...]:
    """The request's prompt as token ids (chat: through the model's chat template); token ids
    it names (prompt, logit_bias) checked against the vocabulary."""
    model = backend.text_model
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
    """The session a request runs (its seed drawn at random when it gave none)."""
    default = backend.max_tokens if req.kind == "chat" else DEFAULT_COMPLETION_TOKENS
    fields = session_fields(
        req,
        defaults=backend.chat_defaults,
        max_tokens=default,
        seed=secrets.randbelow(SEED_LIMIT),
    )
    return SessionConfig(
        prompt=_prompt_ids(backend, req),
        mode=backend.mode,
        draft=backend.draft,
        **fields,
    )


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not JSON: {e}") from None


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
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


async def _stream(gen: Generation, req: ApiRequest, rid: str, model: str) -> AsyncIterator[str]:
    """The SSE `data:` payloads of a streamed answer, `[DONE]` last; an error mid-stream is
    sent as an `{"error": ...}` payload. A cancellation (the client went away) closes the
    session."""
    created = int(time.time())
    try:
        if req.kind == "chat":
            yield json.dumps(chunk(req, rid, created, model, None))
        try:
            async for piece in gen.pieces():
                yield json.dumps(chunk(req, rid, created, model, piece))
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


async def _complete(backend: Backend, request: Request, kind: str, api_key: str | None) -> Response:
    """One request: check it, open its session, then stream or wait for the whole answer."""
    _check_key(request, api_key)
    req = parse_request(kind, await _body(request))
    if req.model not in (None, backend.model_id):
        raise ApiError(
            f"model {req.model!r} is not served here (this server serves {backend.model_id!r})",
            status=404,
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    gen = Generation(backend, _config(backend, req), req.stop)
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
    try:
        if await _until_disconnect(request, gen.start()) is DISCONNECTED:
            gen.close()
            return Response(status_code=499)  # nobody reads it: the client is gone
        if req.stream:
            stream = _stream(gen, req, rid, backend.model_id)
            return EventSourceResponse(stream, sep="\n", ping=15)
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


def _check_key(request: Request, api_key: str | None) -> None:
    """401 unless the request carries `Authorization: Bearer <api_key>` (when one is set)."""
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), api_key):
        raise ApiError(
            "missing or wrong API key (Authorization: Bearer <key>)",
            status=401,
            type="authentication_error",
            code="invalid_api_key",
        )


def create_app(backend: Backend, *, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving `backend`; with `api_key`, every /v1 route wants
    `Authorization: Bearer <api_key>` (401 otherwise)."""
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

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _check_key(request, api_key)
        card = {
            "id": backend.model_id,
            "object": "model",
            "created": started,
            "owned_by": "jaxspec",
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(backend, request, "chat", api_key)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(backend, request, "completion", api_key)

    return app


def ready_line(model_id: str, host: str, port: int) -> str:
    """The line a server prints once it listens (tests and scripts wait for it)."""
    return f"jaxspec OpenAI endpoint serving {model_id} on http://{host}:{port}/v1"


async def serve_app(app: FastAPI, host: str, port: int, model_id: str) -> None:
    """Run `app` under uvicorn in this event loop until SIGINT/SIGTERM; print `ready_line`
    (with the port bound: `port` 0 picks a free one) once it listens."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))

    async def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1]
        print(ready_line(model_id, host, bound), file=sys.stderr, flush=True)

    told = asyncio.ensure_future(announce())
    try:
        await server.serve()
    finally:
        told.cancel()


# -- the command-line side, shared by `python -m edge serve` and `jaxspec serve` ------------

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """`--host --port --api-key --served-model-name --chat-template --max-new-tokens
    --allow-insecure-public`: the HTTP side of both serve commands."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    parser.add_argument(
        "--port", type=port_arg(zero_picks_free=True), default=8000, help="0 picks a free one"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="clients must send `Authorization: Bearer KEY` (or $JAXSPEC_API_KEY); without it "
        "anyone who reaches the port is served",
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


def check_serve_args(args: argparse.Namespace) -> None:
    """The serve flags, before anything loads: `ValueError` naming the bad one. Fills
    `args.api_key` from $JAXSPEC_API_KEY and `args.chat_template_text` from the file."""
    args.api_key = args.api_key or os.environ.get("JAXSPEC_API_KEY") or None
    if args.host not in LOOPBACK and args.api_key is None and not args.allow_insecure_public:
        raise ValueError(
            f"--host {args.host} is not loopback: give --api-key (or $JAXSPEC_API_KEY), or "
            "--allow-insecure-public to serve anyone who reaches it"
        )
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
