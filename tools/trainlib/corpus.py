"""The stdlib corpus of the default pair: documents, the held-out rule, and the tokenizer
trained on them (byte-level BPE with `<s>`/`</s>`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import sysconfig
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainlib.presets import Preset

BOS, EOS = "<s>", "</s>"
HELDOUT_PER_10000 = 300  # ~3 % of documents are held out for evaluation
SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


@dataclasses.dataclass(frozen=True)
class Doc:
    name: str  # "stdlib/<relative path>" or "pydoc/<topic>"
    kind: str  # "source" or "docs"
    text: str


def is_heldout(name: str) -> bool:
    """The evaluation split: a whole document is held out iff its name hashes below 3 %."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 10000 < HELDOUT_PER_10000


def stdlib_documents(root: str | os.PathLike[str] | None = None) -> list[Doc]:
    """Non-test `.py` files of the standard library, sorted by path."""
    base = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if any(part in SKIP_DIRS for part in rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        if rel.as_posix() == "pydoc_data/topics.py":  # its strings come in as the docs below
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if rel.parts[0] == "encodings" and "gencodec.py" in text[:1000]:
            continue  # generated charmap tables: 1.2 MB of hex literals
        if text.strip():
            docs.append(Doc(f"stdlib/{rel.as_posix()}", "source", text))
    return docs


def pydoc_documents() -> list[Doc]:
    from pydoc_data.topics import topics

    return [Doc(f"pydoc/{k}", "docs", topics[k]) for k in sorted(topics) if topics[k].strip()]


def _take_bytes(docs: list[Doc], limit: int | None) -> list[Doc]:
    if limit is None:
        return docs
    out, total = [], 0
    for d in docs:
        if total >= limit:
            break
        out.append(d)
        total += len(d.text.encode())
    return out


def build_corpus(preset: Preset) -> tuple[list[Doc], list[Doc]]:
    """(train, held-out) documents. The tiny preset takes a prefix of each kind."""
    train: list[Doc] = []
    held: list[Doc] = []
    for docs in (stdlib_documents(), pydoc_documents()):
        tr = [d for d in docs if not is_heldout(d.name)]
        ev = [d for d in docs if is_heldout(d.name)]
        n_kinds = 2
        train += _take_bytes(
            tr, None if preset.max_train_bytes is None else preset.max_train_bytes // n_kinds
        )
        held += _take_bytes(
            ev, None if preset.max_eval_bytes is None else preset.max_eval_bytes // n_kinds
        )
    return train, held


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """Byte-level BPE with `<s>`/`</s>` (ids 0 and 1); encoding with special tokens prepends
    `<s>` as Llama tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, model_max_length=1 << 30
    )


def encode_docs(tokenizer: Any, docs: Sequence[Doc]) -> np.ndarray:
    """One stream: `<s> doc </s>` for every document, in order (uint16 ids)."""
    encs = tokenizer.backend_tokenizer.encode_batch(
        [d.text for d in docs], add_special_tokens=False
    )
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    parts = [np.asarray([bos, *e.ids, eos], np.uint16) for e in encs]
    return np.concatenate(parts) if parts else np.zeros((0,), np.uint16)
