"""Text <-> token ids for a loaded model: the one prompt encoder every entry point uses."""

from __future__ import annotations

from collections.abc import Sequence

from jaxspec.model import Model


def encode_prompt(model: Model, text: str) -> tuple[int, ...]:
    """Token ids of `text` as a prompt (no special tokens added).

    A checkpoint without a tokenizer takes whitespace-separated ids ("1 2 3"). An empty
    encoding becomes `(bos,)` where the model has a BOS token, so there is always a context.
    """
    tok = model.tokenizer
    if tok is None:
        return tuple(int(t) for t in text.split())
    ids = tok.encode(text, add_special_tokens=False)
    bos = model.config.bos_token_id
    return tuple(ids) if ids else ((bos,) if bos is not None else ())


def decode_text(model: Model, ids: Sequence[int]) -> str:
    """Readable text of new tokens (special tokens dropped); ids joined by spaces without a
    tokenizer."""
    tok = model.tokenizer
    if tok is None:
        return " ".join(map(str, ids))
    return tok.decode(list(ids), skip_special_tokens=True)
