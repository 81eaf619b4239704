"""Arguments that cannot work, refused before anything is loaded or bound: one rule, and one
wording, for every command (`python -m verify serve`, `python -m edge generate` / `serve`,
`jaxspec serve`, `jaxspec generate`). Each check raises `ValueError` with one line; the
command prints it as `<command>: error: <line>` and exits 2.

- `refuse_sessionless`: a `--max-len` that holds no session (a prompt token, a new token and
  the positions a slot keeps for a draft block);
- `refuse_unaffordable_cache`: a KV slot pool (`--max-sessions` x `--max-len`) larger than
  the memory this machine has available;
- `refuse_other_vocabularies`: a target and a draft (or the verifier a client talks to) whose
  vocabularies differ: their token ids mean different things;
- `refuse_pair_with_models`: `--pair` given with a model named (`--checkpoint`, `--draft`),
  where the pair would be silently ignored.

The models' configs are read without loading any weights (`checkpoint_config`); a check
whose config cannot be read so cheaply is left to loading, which then says what is wrong.
"""

from __future__ import annotations

import json
import pathlib

import gguf

from jaxspec.ckpts.checkpoint import BUILTIN_DIR, BUILTIN_NAMES
from jaxspec.ckpts.gguf_import import find_gguf, gguf_config
from jaxspec.nn.config import LlamaConfig
from jaxspec_host import hub

MEMINFO = pathlib.Path("/proc/meminfo")


def checkpoint_config(checkpoint: str) -> tuple[LlamaConfig, int | None] | None:
    """A checkpoint's config (a directory, a GGUF, a built-in or remote name) and, for a
    quantized one, its group size (None: per channel or not quantized), read without loading
    any weights. None when it cannot be read so cheaply (then loading the checkpoint says
    what is wrong with it)."""
    d = pathlib.Path(checkpoint)
    remote = hub.remote_model(checkpoint)
    if not d.exists() and checkpoint in BUILTIN_NAMES:
        d = BUILTIN_DIR / BUILTIN_NAMES[checkpoint]
    elif not d.exists() and remote is not None:
        d = hub.model_dir(remote)  # not there yet: the load pulls it, then says
    elif not d.exists() and (copy := hub.quantized_copy(checkpoint)) is not None:
        d = hub.copy_dir(copy)  # not built yet: the load builds it, then says
    try:
        g = find_gguf(d)
        if g is not None:
            return gguf_config(gguf.GGUFReader(str(g)), str(g)), None
        raw = json.loads((d / "config.json").read_text())
        quant = raw.get("quantization_config") or {}
        group = quant.get("group_size") if quant.get("quant_method") == "jaxspec-aqt" else None
        return LlamaConfig.from_hf(raw), group
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # CheckpointError too
        return None


def checkpoint_vocab(checkpoint: str) -> int | None:
    """The vocabulary size in a checkpoint's config (`checkpoint_config`), or None."""
    read = checkpoint_config(checkpoint)
    return None if read is None else read[0].vocab_size


def refuse_sessionless(max_len: int, max_gamma: int) -> None:
    """A slot of `max_len` positions must hold a one-token prompt, one new token and the
    `max_gamma` + 1 positions it keeps for a draft block."""
    need = 2 + max_gamma + 1
    if max_len < need:
        raise ValueError(
            f"--max-len {max_len} holds no session: one needs at least {need} positions (a "
            f"prompt token, a new token and {max_gamma + 1} kept for a block of up to "
            f"{max_gamma} drafts)"
        )


def available_memory() -> int | None:
    """Bytes of memory this machine has available now (Linux's MemAvailable), or None where
    it cannot say."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def kv_cache_bytes(config: LlamaConfig, sessions: int, max_len: int, itemsize: int) -> int:
    """Bytes of a KV slot pool of `sessions` slots of `max_len` positions (keys and values
    of every layer, `jaxspec.nn.model.init_cache`'s shape)."""
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_position * itemsize * sessions * max_len


def size_words(n: float) -> str:
    """Bytes in words: '1.97 TB', '512 MB'."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def refuse_unaffordable_cache(
    checkpoint: str, max_sessions: int, max_len: int, itemsize: int = 4
) -> None:
    """A KV slot pool for `checkpoint` larger than the memory available (allocating it ends
    in an XLA error with a traceback, after the target has loaded)."""
    read = checkpoint_config(checkpoint)
    have = available_memory()
    if read is None or have is None:
        return
    need = kv_cache_bytes(read[0], max_sessions, max_len, itemsize)
    if need > have:
        raise ValueError(
            f"--max-sessions {max_sessions} x --max-len {max_len} needs a KV cache of "
            f"{size_words(need)} for {checkpoint}, more than the {size_words(have)} of memory "
            "available here: lower --max-sessions or --max-len"
        )


def refuse_other_vocabularies(models: dict[str, str | int | None]) -> None:
    """Models whose vocabularies differ, `models` mapping each's role ("target", "draft",
    "the verifier") to a checkpoint (read cheaply) or a vocabulary size; None, or one that
    cannot be read cheaply, is skipped."""
    sizes = {}
    for role, model in models.items():
        size = checkpoint_vocab(model) if isinstance(model, str) else model
        if size:
            sizes[role] = (model, size)
    if len({size for _, size in sizes.values()}) > 1:
        said = ", ".join(
            f"{role} {m}: {size}" if isinstance(m, str) else f"{role}: {size}"
            for role, (m, size) in sizes.items()
        )
        raise ValueError(
            f"the models' vocabularies differ (tokens of {said}): a draft must share its "
            "target's tokenizer, and a client the verifier's target's"
        )


def refuse_pair_with_models(choice: str, target: str | None, draft: str | None) -> None:
    """`--pair` chooses the models when none is named: given (not `auto`, the default) with
    `--checkpoint` or `--draft`, it would be ignored without a word."""
    given = (("checkpoint", target), ("draft", draft))
    named = [f"--{flag} {name}" for flag, name in given if name is not None]
    if choice != "auto" and named:
        raise ValueError(
            f"--pair {choice} with {' and '.join(named)}: --pair chooses the models when none "
            "is named; drop --pair, or the model flags"
        )
