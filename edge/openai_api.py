"""The OpenAI API's requests and answers as pure functions (no HTTP, no model, no I/O).

`parse_request` (over a body `edge.openai_body.decode_body` decoded) checks a
`/v1/chat/completions` or `/v1/completions` body field by field and
returns an `ApiRequest`, or raises `ApiError` (HTTP 400) naming the field: an unknown or
unsupported field is refused, never ignored, so a client never believes a setting took effect
when it did not (the sampling fields by making the library's `SamplingSettings` of them: a
request is a trust boundary); the fields that ask for nothing jaxspec lacks (`user`, `name`
on a message, `response_format` text, `logprobs: false`, ...: `NEUTRAL`, `IGNORED`) are
accepted. `session_fields` turns it into the `SessionConfig` keywords the edge session runs
with; `TextStream` turns committed tokens into text incrementally, holding back an unfinished
UTF-8 character and what may still become a stop string; the `*_body` / `*_chunk` functions
shape the JSON answers (docs/service.md). `status_of` maps the verifier's gRPC statuses to
HTTP statuses and OpenAI error types.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxspec.decoding.sampling import SEED_LIMIT
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import InvalidArgument, SamplingSettings, VerifierError
from jaxspec_host.flags import MODEL_SAMPLING, model_sampling

MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 256  # characters per stop string (the held-back tail is checked per chunk)
MAX_TOKENS = (1 << 31) - 1  # what the wire carries; a verifier's --max-len refuses far less
ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's newer name of system
COMMON = (
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
    "logit_bias", "presence_penalty", "frequency_penalty", "n", "stream", "stream_options",
    "top_k", "min_p", "repetition_penalty", "ignore_eos",
)  # fmt: skip
FIELDS = {"chat": ("messages", *COMMON), "completion": ("prompt", *COMMON)}
# Fields jaxspec does not serve, accepted only with a value that asks for nothing it lacks
# (what clients send by default); any other value is a 400 naming the field.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),  # without tools both mean: answer in text
    "parallel_tool_calls": (None, True, False),  # without tools: nothing to run in parallel
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "web_search_options": (None,),
    # vLLM's extras, at what jaxspec does anyway
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "add_generation_prompt": (None, True),
    "include_stop_str_in_output": (None, False),
}
# Fields accepted with any value of their type and not used: identifiers, tags and hints for
# OpenAI's own bookkeeping (abuse tracking, stored completions, its prompt cache), which
# change nothing in an answer.
IGNORED: dict[str, type] = {
    "user": str,
    "safety_identifier": str,
    "prompt_cache_key": str,
    "metadata": dict,
}
# Keys a chat message may carry besides role and content: `name` (passed to the template),
# and what an assistant message read back from an answer holds, at its empty value.
MESSAGE_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tool_calls": (None, []),
    "function_call": (None,),
    "refusal": (None,),
    "audio": (None,),
    "annotations": (None, []),
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
# What gRPC says when a message is over a size limit: the request is too large, not the
# verifier too busy (a 429 would be retried by the openai SDK, three times the work).
TOO_LARGE = ("larger than max", "message too large", "exceeds the size limit")


def show(value: Any) -> str:
    """`repr(value)`, cut to a few dozen characters (a refusal never echoes a whole body)."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40
_REPR.maxlevel = 2


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
    429 the verifier is out of slots or queue (RESOURCE_EXHAUSTED), 413 a message over a
    size limit (RESOURCE_EXHAUSTED too, but retrying cannot help), 503 no verifier answers
    (UNAVAILABLE), 504 a deadline; anything else 500."""
    code = getattr(error, "code", "INTERNAL")
    status, kind = STATUS.get(code, (500, "server_error"))
    if code == "RESOURCE_EXHAUSTED" and any(w in str(error).lower() for w in TOO_LARGE):
        status, kind = 413, "invalid_request_error"
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
    ignore_eos: bool = False  # vLLM's: the model's end token does not end the answer


def _bad(field: str, message: str) -> ApiError:
    return ApiError(f"{field}: {message}", param=field, code="invalid_value")


def _number(body: Mapping[str, Any], field: str) -> float | None:
    v = body.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v):
        raise _bad(field, f"must be a finite number, got {show(v)}")
    return float(v)


def _finite(v: float) -> bool:
    """Whether `v` is a finite float, or an int a float can hold."""
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past 1.8e308
        return False


def _boolean(body: Mapping[str, Any], field: str) -> bool | None:
    v = body.get(field)
    if v is not None and not isinstance(v, bool):
        raise _bad(field, f"must be true or false, got {show(v)}")
    return v


def _integer(body: Mapping[str, Any], field: str, low: int | None = None) -> int | None:
    v = body.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(field, f"must be an integer, got {show(v)}")
    if low is not None and v < low:
        raise _bad(field, f"must be >= {low}, got {show(v)}")
    return v


def _check_fields(kind: str, body: Mapping[str, Any]) -> None:
    """400 for any field that is neither served nor neutral (naming it)."""
    for field, value in body.items():
        if field in FIELDS[kind] or field in IGNORED:
            continue
        if field == "response_format" and value not in NEUTRAL[field]:
            raise _unsupported(field, _response_format(value))
        if field in NEUTRAL:
            if not _neutral(value, NEUTRAL[field]):
                raise _unsupported(
                    field, f"not supported by jaxspec (only {NEUTRAL[field]!r} is accepted)"
                )
            continue
        other = "prompt" if kind == "chat" else "messages"
        field = show(field)
        hint = f" (this endpoint takes {FIELDS[kind][0]!r})" if field == other else ""
        raise ApiError(
            f"{field}: unknown or unsupported field{hint}; jaxspec serves "
            f"{', '.join(FIELDS[kind])}",
            param=field,
            code="unsupported_field",
        )


def _unsupported(field: str, why: str) -> ApiError:
    return ApiError(f"{field}: {why}", param=field, code="unsupported_field")


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `allowed` (JSON's way: `true` is not `1`)."""
    return any(type(value) is type(a) and value == a for a in allowed)


def _response_format(value: Any) -> str:
    """Why a `response_format` other than text is refused."""
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind in ("json_object", "json_schema"):
        return (
            f"{kind} is not supported: jaxspec does not constrain its output to JSON (ask "
            'for JSON in the prompt, or send {"type": "text"})'
        )
    return f'must be {{"type": "text"}}, got {show(value)}'


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
    raise _bad(f"messages[{i}].content", f"must be a string or text parts, got {show(content)}")


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    """Checked chat messages as `{"role", "content"}`, and `name` where given (the template
    may use it); developer read as system; an assistant's null content as ""."""
    if not isinstance(value, list) or not value:
        raise _bad("messages", "must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise _bad(f"messages[{i}]", f"must be an object, got {show(m)}")
        for key in set(m) - {"role", "content", "name"}:
            if key not in MESSAGE_NEUTRAL or not _neutral(m[key], MESSAGE_NEUTRAL[key]):
                raise _bad(
                    f"messages[{i}].{show(key)}",
                    "unsupported (a message takes role, content and name)",
                )
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}].role", f"must be one of {ROLES}, got {show(role)}")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        msg = {"role": "system" if role == "developer" else role, "content": _content(i, content)}
        if m.get("name") is not None:
            if not isinstance(m["name"], str):
                raise _bad(f"messages[{i}].name", f"must be a string, got {show(m['name'])}")
            msg["name"] = m["name"]
        out.append(msg)
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
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad("stop", f"a stop string has at most {MAX_STOP_CHARS} characters")
    return tuple(stops)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    a = _integer(body, "max_tokens", 1)
    b = _integer(body, "max_completion_tokens", 1)
    for field, v in (("max_tokens", a), ("max_completion_tokens", b)):
        if v is not None and v > MAX_TOKENS:
            raise _bad(field, f"must be <= {MAX_TOKENS}, got {show(v)}")
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
            raise _bad("logit_bias", f"keys are token ids, got {show(key)}") from None
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not _finite(bias):
            raise _bad("logit_bias", f"[{show(key)}] must be a finite number, got {show(bias)}")
        out[tok] = float(bias)
    return out


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage)."""
    stream = _boolean(body, "stream")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise _bad("stream_options", "only allowed with stream: true")
    if not isinstance(opts, Mapping):
        raise _bad("stream_options", f"must be an object, got {show(opts)}")
    for key, value in opts.items():
        if key not in STREAM_OPTIONS:
            raise _bad("stream_options", f"jaxspec serves {STREAM_OPTIONS}, not {show(key)}")
        if not isinstance(value, bool) or (key != "include_usage" and value):
            want = "true or false" if key == "include_usage" else "false"
            raise _bad(f"stream_options.{key}", f"must be {want}, got {show(value)}")
    return True, opts.get("include_usage", False)


# stream_options keys: include_usage served; the others accepted at false (OpenAI's padding
# against length side channels, vLLM's usage in every chunk) and refused otherwise.
STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")


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
        raise _bad("seed", f"must be in [0, 2**32), got {show(seed)}")
    for field, want in (("model", str), *IGNORED.items()):
        if (v := body.get(field)) is not None and not isinstance(v, want):
            what = "a string" if want is str else "an object"
            raise _bad(field, f"must be {what}, got {show(v)}")
    model = body.get("model")
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
        ignore_eos=bool(_boolean(body, "ignore_eos")),
    )


def session_fields(
    req: ApiRequest, *, defaults: Mapping[str, float], max_tokens: int, seed: int
) -> dict[str, Any]:
    """The `SessionConfig` keywords of `req` (all but prompt, mode and draft): its sampling
    fields; for chat, the model's own generation settings (`defaults`, as `edge generate
    --chat` takes them, `jaxspec_host.flags.model_sampling`) where it gave none; `max_tokens`
    and `seed` where it gave none; with `ignore_eos` no stop token (the end token is drawn
    like any other and the answer runs to max_tokens or a stop string)."""
    values: dict[str, Any] = {}
    if req.kind == "chat":
        values.update(model_sampling(defaults, MODEL_SAMPLING))
    values.update(req.sampling)
    return {
        "sampling": SamplingSettings(**values),
        "max_new_tokens": req.max_tokens if req.max_tokens is not None else max_tokens,
        "seed": req.seed if req.seed is not None else seed,
        "stop_tokens": () if req.ignore_eos else None,
    }


class TextStream:
    """Committed tokens -> the answer's text, cut before the first stop string.

    `feed(tokens)` adds tokens; `take()` returns the text not returned yet that can no longer
    change; `take(final=True)` returns the rest. The text grows incrementally, as vLLM's
    detokenizer does: each token decodes a few tokens' window, never the whole answer again;
    tokens that end in an unfinished UTF-8 character (byte tokens, "\ufffd" in their decoding)
    add nothing until a later token finishes it, so a stop string is matched on the text
    however the tokens split it. `take()` also holds back a tail that a stop string starts
    with. Once a stop string appears the text ends before it (the one that starts first, if
    one token completes several), `stopped` is set and later tokens are not counted
    (`tokens` ends with the token that completed it).
    """

    PENDING_MAX = 8  # tokens that may stay undecided (a UTF-8 character is at most 4 bytes)

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(stop)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0  # characters returned by take()
        self.stopped = False
        self.prefix = self.read = 0  # the decode window: tokens[prefix:read] are in `text`

    def feed(self, tokens: Sequence[int]) -> None:
        """Add committed tokens (checked for stop strings one token at a time)."""
        for t in tokens:
            if self.stopped:
                return
            self.tokens.append(int(t))
            self._advance(final=False)

    def _advance(self, final: bool) -> None:
        """Move the decoded text up to the last token, unless it ends mid-character (or
        `final`: whatever it is)."""
        end = len(self.tokens)
        done = self.decode(self.tokens[self.prefix : self.read]) if self.read > self.prefix else ""
        full = self.decode(self.tokens[self.prefix : end])
        # an unfinished character (wait for its next byte), or nothing printable yet (a
        # special token)
        if (full.endswith("\ufffd") or len(full) <= len(done)) and not final:
            if end - self.read < self.PENDING_MAX:
                return
            # Bytes that never become a character: take all but the last 3 tokens (a
            # character still in progress has at most 3 of its bytes, one token each).
            end -= 3
            full = self.decode(self.tokens[self.prefix : end])
        self.prefix, self.read = self.read, end
        self._append(full[len(done) :])

    def _append(self, new: str) -> None:
        """Add decoded text, cutting it before the first stop string that now appears."""
        start = max(0, len(self.text) - self.longest + 1)
        self.text += new
        hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True

    def _held(self) -> int:
        """Length of the text's longest tail that a stop string starts with."""
        t, best = self.text, 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(t)), best, -1):
                if t.endswith(s[:k]):
                    best = k
                    break
        return best

    def take(self, final: bool = False) -> str:
        """The text ready to send since the last call."""
        if final and not self.stopped and self.read < len(self.tokens):
            self._advance(final=True)  # the answer ended mid-character: send what it is
        end = len(self.text)
        if not (final or self.stopped):
            end -= self._held()
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
    """OpenAI's `usage` (`prompt_tokens_details.cached_tokens` 0: no prompt is served from a
    cache), plus `jaxspec`: the verifier's acceptance figures for the request (alpha =
    accepted drafts / drafts verified, tokens per verify round, and per draft position the
    blocks whose draft there was accepted)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
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
