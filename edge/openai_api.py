"""The OpenAI API's requests and answers as pure functions (no HTTP, no model, no I/O).

`parse_request` checks a `/v1/chat/completions` or `/v1/completions` body field by field and
returns an `ApiRequest`, or raises `ApiError` (HTTP 400) naming the field: an unknown or
unsupported field is refused, never ignored, so a client never believes a setting took effect
when it did not (the sampling fields by making the library's `SamplingSettings` of them: a
request is a trust boundary). `session_fields` turns it into the `SessionConfig` keywords the
edge session runs with; `TextStream` turns committed tokens into text, holding back what may
still become a stop string; the `*_body` / `*_chunk` functions shape the JSON answers
(docs/service.md). `status_of` maps the verifier's gRPC statuses to HTTP statuses and OpenAI
error types.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import InvalidArgument, SamplingSettings, VerifierError
from jaxspec.sampling import SEED_LIMIT

MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_TOKENS = (1 << 31) - 1  # what the wire carries; a verifier's --max-len refuses far less
ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer name of system
COMMON = (
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
    "logit_bias", "presence_penalty", "frequency_penalty", "n", "stream", "stream_options",
    "top_k", "min_p", "repetition_penalty", "user",
)  # fmt: skip
FIELDS = {"chat": ("messages", *COMMON), "completion": ("prompt", *COMMON)}
# Fields jaxspec does not serve, accepted only with the value that asks for nothing (what
# some clients send by default); any other value is a 400 naming the field.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}
# gRPC status of a verifier error -> (HTTP status, OpenAI error type).
STATUS: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout"),
}


class ApiError(Exception):
    """An answer that is an error: its HTTP `status` and OpenAI's error object (`body()`)."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",  # OpenAI's name for it
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`, as OpenAI answers errors."""
        err = {"message": str(self), "type": self.type, "param": self.param, "code": self.code}
        return {"error": err}


def status_of(error: VerifierError) -> ApiError:
    """The `ApiError` for a verifier's error: 400 bad input, 401 the edge's token refused,
    429 the verifier is out of slots or queue (RESOURCE_EXHAUSTED), 503 no verifier answers
    (UNAVAILABLE), 504 a deadline; anything else 500."""
    code = getattr(error, "code", "INTERNAL")
    status, kind = STATUS.get(code, (500, "server_error"))
    return ApiError(f"verifier: {error}", status=status, type=kind, code=code.lower())


@dataclasses.dataclass(frozen=True, kw_only=True)
class ApiRequest:
    """One checked request. `sampling` holds only the sampling fields the request gave
    (`SessionConfig` names); `messages` for chat, `prompt` (text or token ids) otherwise."""

    kind: str  # "chat" | "completion"
    model: str | None = None
    messages: tuple[dict[str, str], ...] = ()
    prompt: str | tuple[int, ...] = ""
    max_tokens: int | None = None
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


def _bad(field: str, message: str) -> ApiError:
    return ApiError(f"{field}: {message}", param=field, code="invalid_value")


def _number(body: Mapping[str, Any], field: str) -> float | None:
    v = body.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(field, f"must be a finite number, got {v!r}")
    return float(v)


def _integer(body: Mapping[str, Any], field: str, low: int | None = None) -> int | None:
    v = body.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(field, f"must be an integer, got {v!r}")
    if low is not None and v < low:
        raise _bad(field, f"must be >= {low}, got {v}")
    return v


def _check_fields(kind: str, body: Mapping[str, Any]) -> None:
    """400 for any field that is neither served nor neutral (naming it)."""
    for field, value in body.items():
        if field in FIELDS[kind]:
            continue
        if field in NEUTRAL:
            if value not in NEUTRAL[field]:
                raise ApiError(
                    f"{field}: not supported by jaxspec (only {NEUTRAL[field]!r} is accepted)",
                    param=field,
                    code="unsupported_field",
                )
            continue
        other = "prompt" if kind == "chat" else "messages"
        hint = f" (this endpoint takes {FIELDS[kind][0]!r})" if field == other else ""
        raise ApiError(
            f"{field}: unknown or unsupported field{hint}; jaxspec serves "
            f"{', '.join(FIELDS[kind])}",
            param=field,
            code="unsupported_field",
        )


def _content(i: int, content: Any) -> str:
    """A message's text: a string, or a list of `{"type": "text", "text": ...}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise _bad(f"messages[{i}].content", "only text parts are supported")
            if not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content", "a text part needs a string 'text'")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content", f"must be a string or text parts, got {content!r}")


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    """Checked chat messages as `{"role", "content"}` (developer read as system)."""
    if not isinstance(value, list) or not value:
        raise _bad("messages", "must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise _bad(f"messages[{i}]", f"must be an object, got {m!r}")
        extra = set(m) - {"role", "content"}
        if extra:
            raise _bad(f"messages[{i}]", f"unsupported keys {sorted(extra)} (role, content)")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"must be one of {ROLES}, got {role!r}")
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _content(i, m.get("content"))})
    return tuple(out)


def _prompt(value: Any) -> str | tuple[int, ...]:
    """A completion prompt: text, token ids, or a list holding one of those."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        if any(isinstance(t, bool) or t < 0 for t in value):
            raise _bad("prompt", "token ids must be integers >= 0")
        return tuple(value)
    if isinstance(value, list) and len(value) > 1:
        raise _bad("prompt", "one prompt per request (a batch of prompts is not supported)")
    raise _bad("prompt", "must be a non-empty string or a list of token ids")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop", "must be a non-empty string or a list of them")
    if len(stops) > MAX_STOP:
        raise _bad("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}")
    return tuple(stops)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    a = _integer(body, "max_tokens", 1)
    b = _integer(body, "max_completion_tokens", 1)
    for field, v in (("max_tokens", a), ("max_completion_tokens", b)):
        if v is not None and v > MAX_TOKENS:
            raise _bad(field, f"must be <= {MAX_TOKENS}, got {v}")
    if a is not None and b is not None and a != b:
        raise _bad("max_completion_tokens", f"differs from max_tokens ({b} != {a}); give one")
    return b if b is not None else a


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields given (`SamplingSettings` names), each checked by making the
    library's `SamplingSettings` of it: the check every value of a session passes, here with
    a 400 naming the field. Fields not given stay out (a chat takes the model's there)."""
    out: dict[str, Any] = {}
    for field in ("temperature", "top_p", "min_p"):
        if (v := _number(body, field)) is not None:
            out[field] = v
    if (k := _integer(body, "top_k", -1)) is not None:
        out["top_k"] = max(k, 0)  # vLLM's -1 and 0 both mean off
    for field in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if (v := _number(body, field)) is not None:
            out[field] = v
    if (bias := body.get("logit_bias")) is not None:
        out["logit_bias"] = _logit_bias(bias)
    for field, value in out.items():
        try:
            out[field] = getattr(SamplingSettings(**{field: value}), field)
        except InvalidArgument as e:
            raise _bad(field, str(e)) from None
    return out


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's `{"token id": bias}` with the ids as ints (`_sampling` checks the entries)."""
    if not isinstance(value, Mapping):
        raise _bad("logit_bias", "must map token ids (as strings) to biases")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise _bad("logit_bias", f"keys are token ids, got {key!r}") from None
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise _bad("logit_bias", f"[{key}] must be a number, got {bias!r}")
        out[tok] = float(bias)
    return out


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false, got {stream!r}")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise _bad("stream_options", "only allowed with stream: true")
    if not isinstance(opts, Mapping) or set(opts) - {"include_usage"}:
        raise _bad("stream_options", "jaxspec serves only {include_usage: bool}")
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _bad("stream_options.include_usage", f"must be true or false, got {usage!r}")
    return True, usage


def parse_request(kind: str, body: Any) -> ApiRequest:
    """Check a request body of `kind` ("chat": /v1/chat/completions, "completion":
    /v1/completions) and return it as an `ApiRequest`; `ApiError` (400) names the first bad,
    unknown or unsupported field. `n` must be 1: one choice per request (send several
    requests, each with its own seed, for more)."""
    if not isinstance(body, Mapping):
        raise ApiError("the request body must be a JSON object")
    _check_fields(kind, body)
    first = FIELDS[kind][0]
    if first not in body:
        raise _bad(first, "is required")
    n = _integer(body, "n", 1)
    if n not in (None, 1):
        raise _bad("n", f"only n=1 is served (one choice per request), got {n}")
    seed = _integer(body, "seed", 0)
    if seed is not None and seed >= SEED_LIMIT:
        raise _bad("seed", f"must be in [0, 2**32), got {seed}")
    model, user = body.get("model"), body.get("user")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string, got {model!r}")
    if user is not None and not isinstance(user, str):
        raise _bad("user", f"must be a string, got {user!r}")
    stream, include_usage = _stream(body)
    return ApiRequest(
        kind=kind,
        model=model,
        messages=_messages(body["messages"]) if kind == "chat" else (),
        prompt=_prompt(body["prompt"]) if kind == "completion" else "",
        max_tokens=_max_tokens(body),
        sampling=_sampling(body),
        seed=seed,
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
    )


def session_fields(
    req: ApiRequest, *, defaults: Mapping[str, float], max_tokens: int, seed: int
) -> dict[str, Any]:
    """The `SessionConfig` keywords of `req` (all but prompt, mode and draft): its sampling
    fields; for chat, the model's own generation settings (`defaults`, as `edge generate
    --chat` takes them) where it gave none; `max_tokens` and `seed` where it gave none."""
    values: dict[str, Any] = {}
    if req.kind == "chat":
        values.update({k: v for k, v in defaults.items() if k in ("temperature", "top_k", "top_p")})
        if "top_k" in values:
            values["top_k"] = int(values["top_k"])
    values.update(req.sampling)
    return {
        "sampling": SamplingSettings(**values),
        "max_new_tokens": req.max_tokens if req.max_tokens is not None else max_tokens,
        "seed": req.seed if req.seed is not None else seed,
    }


class TextStream:
    """Committed tokens -> the answer's text, cut at the first stop string.

    `feed(tokens)` adds tokens; `take()` returns the text not returned yet that can no
    longer change: it holds back a tail that a stop string starts with and an
    unfinished UTF-8 character ("\ufffd"); `take(final=True)` returns the rest. Once a stop
    string appears, the text ends before it, `stopped` is set and later tokens are not
    counted (`tokens` ends with the token that completed the stop string).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0  # characters returned by take()
        self.stopped = False

    def feed(self, tokens: Sequence[int]) -> None:
        """Add committed tokens (one decode per token with stop strings, else one in all)."""
        if self.stopped or not tokens:
            return
        if not self.stop:
            self.tokens += tokens
            self.text = self.decode(self.tokens)
            return
        for t in tokens:
            self.tokens.append(t)
            text = self.decode(self.tokens)
            start = max(0, len(self.text) - self.hold)
            hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
            if hits:
                self.text, self.stopped = text[: min(hits)], True
                return
            self.text = text

    def _held(self) -> int:
        """Length of the text's longest tail that a stop string starts with."""
        t = self.text
        for k in range(min(self.hold, len(t)), 0, -1):
            if any(s.startswith(t[-k:]) for s in self.stop):
                return k
        return 0

    def take(self, final: bool = False) -> str:
        """The text ready to send since the last call."""
        end = len(self.text)
        if not (final or self.stopped):
            end -= self._held()
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : end], end
        return piece


def finish_reason(stream: TextStream, max_tokens: int, stops: frozenset[int]) -> str:
    """ "stop" (a stop string, or the model's end token), or "length" (max_tokens ran out)."""
    t = stream.tokens
    if stream.stopped or len(t) < max_tokens or (t and t[-1] in stops):
        return "stop"
    return "length"


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    figures: AcceptanceFigures,
) -> dict[str, Any]:
    """OpenAI's `usage`, plus `jaxspec`: the verifier's acceptance figures for the request
    (alpha = accepted drafts / drafts verified, tokens per verify round, and per draft
    position the blocks whose draft there was accepted)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "jaxspec": {
            "acceptance_rate": round(figures.acceptance_rate, 6),
            "tokens_per_round": round(figures.tokens_per_round, 6),
            "rounds": figures.rounds,
            "draft_tokens": figures.num_draft_tokens,
            "accepted_tokens": figures.num_accepted_tokens,
            "accepted_per_position": list(figures.accepted_per_position),
        },
    }


def completion_body(
    req: ApiRequest, rid: str, created: int, model: str, text: str, finish: str, use: dict
) -> dict[str, Any]:
    """The whole answer of a request that did not stream."""
    if req.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def chunk(
    req: ApiRequest,
    rid: str,
    created: int,
    model: str,
    text: str | None,
    finish: str | None = None,
    use: dict | None = None,
) -> dict[str, Any]:
    """One streamed chunk: `text` (None: the chat's opening chunk with the role), `finish` on
    the last one; `use` makes it the usage chunk (no choices), which include_usage asks for
    after the last; with include_usage the others carry `"usage": null`."""
    if use is not None:
        choices: list[dict[str, Any]] = []
    elif req.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {}
        if text:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    out = {
        "id": rid,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if req.include_usage:
        out["usage"] = use
    return out
