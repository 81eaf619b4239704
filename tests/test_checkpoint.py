"""Loading and saving HF checkpoint directories, and the errors users see."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jaxspec
from jaxspec import CheckpointError
from jaxspec.ckpts.tiny import byte_tokenizer, tiny_config
from tests.fixtures import write_hf_checkpoint


def _logits(model, ids):
    pos = np.arange(len(ids))[None]
    logits, _ = model(np.asarray(ids)[None], pos, model.init_cache(1, len(ids)))
    return np.asarray(logits[0])


def test_sharded_checkpoint_loads_like_single_file(tmp_path):
    cfg = tiny_config()
    write_hf_checkpoint(tmp_path / "one", cfg, seed=5)
    write_hf_checkpoint(tmp_path / "many", cfg, seed=5, max_shard_size="20KB")
    assert (tmp_path / "many" / "model.safetensors.index.json").is_file()
    a, b = jaxspec.load(tmp_path / "one"), jaxspec.load(tmp_path / "many")
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)


def test_save_round_trips_and_transformers_loads_it(tmp_path, hf_checkpoints):
    src, _ = hf_checkpoints["mqa_tied"]
    model = jaxspec.load(src)
    out = jaxspec.save(model, tmp_path / "copy")
    again = jaxspec.load(out)
    jax.tree.map(np.testing.assert_array_equal, model.params, again.params)
    assert again.config == model.config

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = [1, 5, 9, 33, 2]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(_logits(again, ids) - ref).max() < 1e-4


def test_bf16_save_and_tokenizer_round_trip(tmp_path):
    tok = byte_tokenizer()
    cfg = tiny_config(vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,))
    model = jaxspec.Model(config=cfg, params=jaxspec.init_params(cfg, 3), tokenizer=tok)
    d = jaxspec.save(model, tmp_path / "bf16", dtype=jnp.bfloat16)
    assert json.loads((d / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = jaxspec.load(d)
    assert loaded.tokenizer.encode("def f(x):", add_special_tokens=False) == tok.encode(
        "def f(x):", add_special_tokens=False
    )
    diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), model.params, loaded.params)
    assert max(jax.tree.leaves(diff)) < 0.01  # bf16 rounding of 0.02-scale weights
    bf = jaxspec.load(d, dtype=jnp.bfloat16)
    assert {x.dtype for x in jax.tree.leaves(bf.params)} == {jnp.dtype(jnp.bfloat16)}
    assert bf.nbytes() * 2 == loaded.nbytes()


@pytest.fixture()
def ckpt(tmp_path, hf_checkpoints):
    d = tmp_path / "ckpt"
    shutil.copytree(hf_checkpoints["gqa"][0], d)
    return d


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def test_missing_directory_and_files(tmp_path, ckpt):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        jaxspec.load(tmp_path / "nope")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors"):
        jaxspec.load(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        jaxspec.load(ckpt)


def test_missing_shard_is_named(tmp_path):
    write_hf_checkpoint(tmp_path, tiny_config(), max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        jaxspec.load(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "unsupported rope"),
        (
            {"intermediate_size": 48},
            r"down_proj\.weight. has shape \(32, 64\), config implies \(32, 48\)",
        ),
        ({"num_hidden_layers": 3}, r"model\.layers\.2\..*missing"),
        ({"num_hidden_layers": 1}, "not in the config's architecture"),
        ({"num_key_value_heads": 3}, "not a multiple"),
    ],
)
def test_config_errors_are_precise(ckpt, changes, message):
    _edit_config(ckpt, **changes)
    with pytest.raises(CheckpointError, match=message):
        jaxspec.load(ckpt)


def test_missing_required_field(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["vocab_size"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'vocab_size'"):
        jaxspec.load(ckpt)


def test_unknown_builtin_name_lists_the_known_ones():
    with pytest.raises(CheckpointError, match="built-in names"):
        jaxspec.load("no-such-model")
