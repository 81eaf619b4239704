"""A request body's bytes as JSON within bounds: nesting depth, no NaN, numbers Python can
hold, strings that are text (no lone UTF-16 surrogate), so no body, however built, is anything
but a request for `edge.openai_api.parse_request` or a 400."""

from __future__ import annotations

import json
from typing import Any

from edge.openai_api import ApiError, show

MAX_DEPTH = 32  # JSON nesting of a body; a request needs 5 (messages[i].content[j].text)


def decode_body(raw: bytes) -> Any:
    """A request body as JSON: `ApiError` (400) for bytes that are not UTF-8 JSON, for NaN
    and Infinity (not JSON), for integers past Python's 4,300 digits and for nesting deeper
    than `MAX_DEPTH` (the parser's recursion limit included)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(raw, parse_constant=refuse)
    except RecursionError:
        raise ApiError(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        why = str(e) if "digits" not in str(e) else "a number has over 4,300 digits"
        raise ApiError(f"the request body is not JSON: {why[:120]}") from None
    _check_decoded(value)
    return value


def _check_decoded(value: Any) -> None:
    """Refuse (400) decoded JSON nested deeper than `MAX_DEPTH` or holding a string that is
    not Unicode text: JSON's `\\ud800` escape decodes to a lone UTF-16 surrogate, which no
    tokenizer or UTF-8 writer takes. Walked without recursion, keys included."""
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, str) and not _is_text(v):
            raise ApiError(
                f"the request body holds a lone UTF-16 surrogate in {show(v)} (a \\ud800-"
                "\\udfff escape not in a high-low pair is not a character)"
            )
        items = [*v, *v.values()] if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is None:
            continue
        if d > MAX_DEPTH:
            raise ApiError(f"the request body is nested deeper than {MAX_DEPTH} levels")
        todo.extend((x, d + 1) for x in items)


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
