"""Hugging Face checkpoint directories <-> `Model`.

A directory holds `config.json`, weights as `model.safetensors` or shards listed in
`model.safetensors.index.json`, and optionally a tokenizer (`tokenizer.json` & co.), which
is loaded through `transformers.AutoTokenizer`. Linear weights are stored `[out, in]` by HF
and `[in, out]` by Flax; the mapping below is the only place that knows both.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import pathlib
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from safetensors import safe_open
from safetensors.flax import save_file

from jaxspec.ckpts.gguf_import import (
    find_gguf,
    gguf_field,
    gguf_reader,
    gguf_tokenizer,
    has_tokenizer,
    read_gguf,
)
from jaxspec.nn.config import CheckpointError, LlamaConfig
from jaxspec.nn.model import Model, param_shapes

PathLike = str | os.PathLike[str]

# Models that ship with the package, loadable by name: `jaxspec.load("default")`.
BUILTIN_DIR = pathlib.Path(__file__).parent / "models"
BUILTIN_NAMES = {"default": "target", "default-draft": "draft", "smollm2-draft": "smollm2-draft"}
_TRAINED_BY = {"smollm2-draft": "tools/distill_smollm2.py"}  # else tools/train_default_models.py

_IGNORED_HF_KEYS = ("rotary_emb.inv_freq",)


def hf_name(flax_path: tuple[str, ...]) -> tuple[str, bool]:
    """HF tensor name of a Flax param path, and whether it is transposed."""
    *mods, leaf = flax_path
    if mods == ["embed_tokens"]:
        return "model.embed_tokens.weight", False
    if mods == ["lm_head"]:
        return "lm_head.weight", True
    if mods == ["norm"]:
        return "model.norm.weight", False
    layer, *rest = mods
    idx = layer.removeprefix("layers_")
    hf_leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[leaf]
    return f"model.layers.{idx}.{'.'.join(rest)}.{hf_leaf}", leaf == "kernel"


def _norm_offset(config: LlamaConfig, name: str) -> float:
    """What an HF tensor `name` lacks of the multiplier jaxspec holds: Gemma stores a norm
    weight w for the multiplier 1 + w."""
    return 1.0 if config.is_gemma and name.endswith("norm.weight") else 0.0


def _resolve(path: PathLike) -> pathlib.Path:
    """The checkpoint directory or GGUF file `path` names (a fetchable model is pulled)."""
    p = pathlib.Path(path)
    gguf = find_gguf(p)
    if gguf is not None:
        return gguf
    if p.is_dir():
        return p
    if str(path) in BUILTIN_NAMES:
        builtin = BUILTIN_DIR / BUILTIN_NAMES[str(path)]
        if not builtin.is_dir():
            raise CheckpointError(
                f"built-in model {str(path)!r} is not installed (expected {builtin}); "
                f"train it with {_TRAINED_BY.get(str(path), 'tools/train_default_models.py')}"
            )
        return builtin
    for fetcher in _fetchers():
        fetched = fetcher.resolve(str(path))
        if fetched is not None:
            return fetched
    if p.exists():
        raise CheckpointError(
            f"{p} is a file; jaxspec.load wants a checkpoint directory or a .gguf file"
        )
    raise CheckpointError(
        f"no checkpoint directory or GGUF file at {str(path)!r} (built-in names: "
        f"{sorted(BUILTIN_NAMES)}; fetched on first use: {_fetchable_names()})"
    )


FETCHERS = "jaxspec.fetchers"  # the entry-point group of the fetchers of models by name
GENERATION_FILE = "generation_config.json"  # HF's recommended sampling settings


@functools.cache
def _fetchers() -> list[Any]:
    """The installed fetchers of models loadable by name (entry points of group `FETCHERS`,
    e.g. `jaxspec_host.hub`): each has `resolve(name)` (a checkpoint path, fetched first if
    need be, or None for a name it does not know) and `names()`. The core never imports one:
    fetching runs pip, which is not the core's business. Every installed distribution is
    read, not the first of each name: a stale `jaxspec.egg-info` left in a source checkout
    (first on sys.path there) must not hide the installed entry points."""
    found = {
        ep.value: ep
        for dist in importlib.metadata.distributions()
        for ep in dist.entry_points
        if ep.group == FETCHERS
    }
    return [ep.load() for ep in found.values()]


def _fetchable_names() -> list[str]:
    return sorted(n for f in _fetchers() for n in f.names())


def _weight_files(d: pathlib.Path) -> list[pathlib.Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (d / f).is_file()]
        if missing:
            raise CheckpointError(f"{index.name} lists shards missing from {d}: {missing}")
        return [d / f for f in files]
    single = d / "model.safetensors"
    if single.is_file():
        return [single]
    if (d / "pytorch_model.bin").is_file():
        raise CheckpointError(f"{d} holds pytorch_model.bin; jaxspec reads safetensors only")
    raise CheckpointError(f"{d} has no model.safetensors or model.safetensors.index.json")


def _read_tensors(files: list[pathlib.Path]) -> dict[str, jax.Array]:
    out: dict[str, jax.Array] = {}
    for f in files:
        with safe_open(str(f), framework="flax") as st:
            for name in st.keys():
                out[name] = st.get_tensor(name)
    return out


def load(path: PathLike, *, dtype: Any = jnp.float32, tokenizer: bool = True) -> Model:
    """Load a HF-format Llama-family checkpoint directory, a GGUF file (or a directory holding
    one), a quantized checkpoint written by `save` (packed weights, no re-quantization), or a
    model by name.

    Args:
      path: checkpoint directory or `.gguf` file; "default" / "default-draft" for the shipped
        tiny pair; "smollm2-draft" for the shipped W4A16 draft of SmolLM2; "smollm2" (alias
        of "smollm2-135m-instruct") for SmolLM2-135M-Instruct, fetched and converted on first
        use (by a fetcher: `jaxspec_host.hub`); "smollm2-w4a16" for its packed W4A16 copy,
        quantized once from it on first use and cached beside it.
      dtype: parameter and activation dtype (float32 matches transformers' float32 logits).
      tokenizer: load the tokenizer with `transformers.AutoTokenizer` when one is present.

    Raises:
      CheckpointError: missing files, unsupported `model_type`, missing or mis-shaped tensors.
    """
    d = _resolve(path)
    if d.suffix == ".gguf" and d.is_file():
        return load_gguf(d, name=str(path), dtype=dtype, tokenizer=tokenizer)
    cfg_file = d / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{d} has no config.json")
    try:
        raw_cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {e}") from None
    quant = raw_cfg.get("quantization_config") or {}
    if quant.get("quant_method") == "jaxspec-aqt":  # written by quant.checkpoints.save_quantized
        from jaxspec.quant.checkpoints import load_quantized

        tok = _load_tokenizer(d) if tokenizer else None
        return load_quantized(d, raw_cfg, dtype=dtype, tokenizer=tok, name=str(path))
    config = LlamaConfig.from_hf(raw_cfg)
    params = params_from_hf(config, _read_tensors(_weight_files(d)), str(d), dtype)
    tok = _load_tokenizer(d) if tokenizer else None
    return Model(config=config, params=params, tokenizer=tok, dtype=dtype, name=str(path))


def params_from_hf(
    config: LlamaConfig, tensors: dict[str, Any], where: str, dtype: Any = jnp.float32
) -> Any:
    """The model's param pytree from HF-named tensors (`[out, in]` linear weights): every
    tensor the config implies must be there with its shape, and nothing else."""
    expected = param_shapes(config)
    used: set[str] = set()

    def take(path: tuple[Any, ...], leaf: jax.ShapeDtypeStruct) -> jax.Array:
        keys = tuple(p.key for p in path)
        name, transpose = hf_name(keys)
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name!r} is missing")
        hf_shape = tuple(leaf.shape)[::-1] if transpose else tuple(leaf.shape)
        arr = tensors[name]
        used.add(name)
        if tuple(arr.shape) != hf_shape:
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(arr.shape)}, config implies {hf_shape}"
            )
        offset = _norm_offset(config, name)
        if offset:  # in float32, as HF's Gemma norm adds it
            return jnp.asarray(jnp.asarray(arr, jnp.float32) + offset, dtype)
        return jnp.asarray(arr.T if transpose else arr, dtype)

    params = jax.tree_util.tree_map_with_path(take, expected)
    extra = [
        n
        for n in tensors
        if n not in used
        and not n.endswith(_IGNORED_HF_KEYS)
        and not (config.tie_word_embeddings and n == "lm_head.weight")
    ]
    if extra:
        raise CheckpointError(
            f"{where}: tensors not in the config's architecture: {sorted(extra)[:5]}"
            f"{' …' if len(extra) > 5 else ''}"
        )
    return params


def load_gguf(
    path: PathLike,
    *,
    name: str = "",
    dtype: Any = jnp.float32,
    tokenizer: bool = True,
    progress: Any = None,
) -> Model:
    """A model from a GGUF file (see `jaxspec.ckpts.gguf_import`), every tensor dequantized."""
    path = pathlib.Path(path)
    config, tensors, reader = read_gguf(path, progress)
    params = params_from_hf(config, tensors, str(path), dtype)
    del tensors
    tok = gguf_tokenizer(path, reader) if tokenizer and has_tokenizer(reader) else None
    return Model(config=config, params=params, tokenizer=tok, dtype=dtype, name=name or str(path))


GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
GGUF_SAMPLING = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p",
                 "top_k": "general.sampling.top_k"}  # fmt: skip


def generation_defaults(path: PathLike) -> dict[str, float]:
    """The sampling settings a checkpoint recommends, those it has of `temperature`, `top_p`
    and `top_k`: from its HF `generation_config.json` (`do_sample: false` means greedy,
    temperature 0), or a GGUF's `general.sampling.*` keys; {} when it says nothing. Models by
    name resolve as in `load` (`jaxspec_host.hub` records SmolLM2's model-card settings there at
    conversion). Chat commands use them where no flag says otherwise."""
    d = _resolve(path)
    if d.suffix == ".gguf" and d.is_file():
        reader = gguf_reader(d)
        out = {}
        for key, field in GGUF_SAMPLING.items():
            value = gguf_field(reader, field)
            if value is not None:
                out[key] = float(value)
        return out
    f = d / GENERATION_FILE
    try:
        raw = json.loads(f.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"{f}: unreadable ({e}); default sampling settings used", stacklevel=2)
        return {}
    if not isinstance(raw, dict):
        warnings.warn(f"{f}: not a JSON object; default sampling settings used", stacklevel=2)
        return {}
    if raw.get("do_sample") is False:
        return {"temperature": 0.0}
    out = {}
    for key, name in GENERATION_KEYS.items():
        if raw.get(name) is None:
            continue
        try:
            out[key] = float(raw[name])
        except (TypeError, ValueError):
            warnings.warn(f"{f}: {name} {raw[name]!r} is not a number; ignored", stacklevel=2)
    return out


def load_tokenizer(path: PathLike) -> Any:
    """Only the tokenizer (with its chat template) of what `load(path)` would load, or None
    when the checkpoint has none: an edge device encodes prompts for a target it does not
    hold."""
    d = _resolve(path)
    if d.suffix == ".gguf" and d.is_file():
        return gguf_tokenizer(d)
    return _load_tokenizer(d)


def _load_tokenizer(d: pathlib.Path) -> Any:
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(d))
    except Exception as e:  # transformers raises many types here
        raise CheckpointError(f"{d}: tokenizer files present but unreadable: {e}") from e


def save(model: Model, path: PathLike, *, dtype: Any = None) -> pathlib.Path:
    """Write `model` as a HF checkpoint directory (config.json, model.safetensors, tokenizer).

    `dtype` (e.g. `jnp.bfloat16`) converts the stored weights; default keeps theirs. A
    quantized model (`jaxspec.quantize`) is written in its packed form instead (see
    `jaxspec.quant.checkpoints.save_quantized`; `dtype` must then be None).
    """
    if model.dense_cls is not None or model.embed_cls is not None:
        from jaxspec.quant.checkpoints import save_quantized

        if dtype is not None:
            raise ValueError("a quantized model is saved as it is; dtype must be None")
        return save_quantized(model, path)
    d = pathlib.Path(path)
    d.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, jax.Array] = {}

    def put(path: tuple[Any, ...], leaf: jax.Array) -> None:
        name, transpose = hf_name(tuple(p.key for p in path))
        arr = jnp.asarray(leaf.T if transpose else leaf)
        offset = _norm_offset(model.config, name)
        if offset:
            arr = (arr.astype(jnp.float32) - offset).astype(leaf.dtype)
        if dtype is not None:
            arr = arr.astype(dtype)
        tensors[name] = arr

    jax.tree_util.tree_map_with_path(put, model.params)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_hf()
    stored = jnp.dtype(dtype if dtype is not None else jax.tree.leaves(model.params)[0].dtype)
    cfg["dtype"] = stored.name
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(d))
    return d
