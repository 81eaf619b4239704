"""tools/distill_smollm2.py without SmolLM2: the prompts it builds from the standard library
(five kinds, seeded), the held-out split the report and benchmarks measure on (never trained
on, its documents kept out of the plain text too), and the length buckets of the data."""

from __future__ import annotations

import collections

import pytest

from tests.tool_scripts import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("distill_smollm2")


@pytest.fixture(scope="module")
def prompts(tool):
    return tool.build_prompts(0)


def test_five_kinds_of_prompts_and_a_held_out_set_never_trained_on(tool, prompts):
    plan = tool.Plan()
    train, held = tool.split_prompts(prompts, plan)
    assert set(prompts) == set(tool.CATEGORIES) == {p.category for p in held}
    assert collections.Counter(p.category for p in held) == {
        c: plan.heldout_per_category for c in tool.CATEGORIES
    }
    assert not {p.text for p in train} & {p.text for p in held}
    assert all(tool.is_heldout(p) for p in held) and not any(tool.is_heldout(p) for p in train)
    assert max(collections.Counter(p.category for p in train).values()) <= plan.prompts_per_category
    assert tool.heldout_prompts() == held  # seeded: built again, the same prompts in order


def test_the_held_out_prompts_are_real_questions(tool, prompts):
    held = tool.split_prompts(prompts, tool.Plan())[1]
    by_kind = {p.category: p.text for p in held}
    assert by_kind["coding"].startswith("Write a Python function `")
    assert by_kind["summarization"].startswith("Summarize this text in two sentences:\n\n")
    assert by_kind["rewriting"].startswith("Rewrite this text in simpler words:\n\n")
    assert by_kind["math"].endswith("?") and any(ch.isdigit() for ch in by_kind["math"])
    assert all(200 > len(p.text) > 30 for p in held if p.category in ("explanation", "math"))


def test_sequences_go_to_the_smallest_bucket_that_holds_them(tool):
    plan = tool.Plan()
    seqs = [[1] * n for n in (2, 65, 66, 200, 321, 1000)]
    buckets = tool.bucketize(seqs, plan)
    assert {T: [len(s) for s in g] for T, g in buckets.items()} == {
        64: [2, 65],
        128: [66],
        256: [200],
        320: [321, 321],
    }  # inputs are tokens[:-1]: a sequence of n tokens needs n - 1 positions
    toks, valid = tool.pad([[5, 6, 7]], 4)
    assert toks.tolist() == [[5, 6, 7, 0]] and valid.tolist() == [[True, True, True, False]]
