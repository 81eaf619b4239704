"""Text <-> token ids for a loaded model: the one prompt encoder every entry point uses, and
chat prompts through the model's own chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jaxspec.nn.model import Model


def encode_prompt(model: Model, text: str) -> tuple[int, ...]:
    """Token ids of `text` as a prompt (no special tokens added, but BOS first for a model that
    needs it: `LlamaConfig.prompt_starts_with_bos`, Gemma).

    A checkpoint without a tokenizer takes whitespace-separated ids ("1 2 3"). An empty
    encoding becomes `(bos,)` where the model has a BOS token, so there is always a context.
    """
    tok = model.tokenizer
    if tok is None:
        return tuple(int(t) for t in text.split())
    ids = tok.encode(text, add_special_tokens=False)
    bos = model.config.bos_token_id
    if model.config.prompt_starts_with_bos and ids[:1] != [bos]:
        ids = [bos, *ids]
    return tuple(ids) if ids else ((bos,) if bos is not None else ())


def decode_text(model: Model, ids: Sequence[int]) -> str:
    """Readable text of new tokens (special tokens dropped); ids joined by spaces without a
    tokenizer."""
    tok = model.tokenizer
    if tok is None:
        return " ".join(map(str, ids))
    return tok.decode(list(ids), skip_special_tokens=True)


Messages = str | Sequence[Mapping[str, str]]


def chat_prompt(model: Model, messages: Messages) -> tuple[int, ...]:
    """Token ids of a chat through the model's chat template, ending with the assistant's
    turn opened (what the model answers). `messages` is one user message as a string, or
    `[{"role": "system" | "user" | "assistant", "content": ...}, ...]`.

    Raises:
      ValueError: the model has no tokenizer or no chat template, or a message is malformed.
    """
    tok = model.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(
            f"{model.name or 'this model'} has no chat template; use a plain prompt instead"
        )
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    msgs = list(messages)
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or not {"role", "content"} <= m.keys():
            raise ValueError(f"message {i} must be a mapping with 'role' and 'content': {m!r}")
    ids = tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return tuple(int(t) for t in ids)
