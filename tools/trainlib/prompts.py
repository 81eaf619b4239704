"""The distillation's chat prompts: five categories (Spec-Bench's kinds) built from the
standard library and the pydoc topics, and the held-out split that is never trained on."""

from __future__ import annotations

import ast
import dataclasses
import hashlib

import numpy as np

from trainlib import corpus
from trainlib.distill_plan import Plan

CATEGORIES = ("coding", "explanation", "summarization", "math", "rewriting")


@dataclasses.dataclass(frozen=True)
class Prompt:
    category: str
    source: str  # the document (or template) it was built from: the held-out rule's key
    text: str


def _paragraphs(text: str, lo: int, hi: int) -> list[str]:
    out = []
    for para in text.split("\n\n"):
        para = " ".join(para.split())
        if lo <= len(para) <= hi and para[0].isalpha() and ">>>" not in para:
            out.append(para)
    return out


def _functions(doc: corpus.Doc) -> list[tuple[str, str]]:
    """(name, first docstring line) of the public top-level functions of a source file."""
    try:
        tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            first = (ast.get_docstring(node) or "").strip().split("\n")[0].strip()
            if 20 <= len(first) <= 160 and first.endswith("."):
                out.append((node.name, first))
    return out


MATH = (
    "{name} has {a} apples. {he} buys {b} more and gives {c} to a friend. How many apples "
    "does {name} have now?",
    "A train travels at {a} km per hour for {b} hours. How far does it go?",
    "A book costs {a} dollars. How much do {b} books cost, and how much change is left from "
    "{c}00 dollars?",
    "There are {a} students in a class and {b} of them are girls. How many boys are there?",
    "{name} saves {a} dollars every week. How many weeks does {he_l} need to save {c}0 dollars?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "A recipe needs {b} eggs for {a} pancakes. How many eggs are needed for {c} pancakes?",
    "{name} reads {a} pages a day. The book has {c}0 pages. How many days does {he_l} need?",
)
NAMES = (("Tom", "He"), ("Sara", "She"), ("Ali", "He"), ("Mia", "She"), ("Ken", "He"))


def build_prompts(seed: int) -> dict[str, list[Prompt]]:
    """Every candidate prompt of each category, in a seeded order."""
    rng = np.random.default_rng(seed)
    source = [d for d in corpus.stdlib_documents() if d.name.endswith(".py")]
    topics = corpus.pydoc_documents()
    out: dict[str, list[Prompt]] = {c: [] for c in CATEGORIES}
    for d in source:
        mod = d.name.removeprefix("stdlib/").removesuffix(".py").removesuffix("/__init__")
        mod = mod.replace("/", ".")
        out["explanation"].append(
            Prompt("explanation", d.name, f"What is the Python module `{mod}` for? Explain "
                   "briefly with an example.")
        )  # fmt: skip
        for name, line in _functions(d)[:6]:
            out["coding"].append(
                Prompt("coding", d.name, f"Write a Python function `{name}` that does the "
                       f"following: {line}")
            )  # fmt: skip
    for d in topics:
        topic = d.name.removeprefix("pydoc/")
        out["explanation"].append(
            Prompt("explanation", d.name, f"Explain '{topic}' in Python to a beginner.")
        )
        for para in _paragraphs(d.text, 250, 600)[:2]:
            out["summarization"].append(
                Prompt("summarization", d.name, f"Summarize this text in two sentences:\n\n"
                       f"{para}")
            )  # fmt: skip
        for para in _paragraphs(d.text, 80, 300)[:2]:
            out["rewriting"].append(
                Prompt("rewriting", d.name, f"Rewrite this text in simpler words:\n\n{para}")
            )
    for i in range(4000):
        name, he = NAMES[i % len(NAMES)]
        a, b, c = (int(x) for x in rng.integers(2, 40, size=3))
        text = MATH[i % len(MATH)].format(name=name, he=he, he_l=he.lower(), a=a, b=b, c=c)
        out["math"].append(Prompt("math", f"math/{text}", text))
    for c in CATEGORIES:
        unique = {p.text: p for p in out[c]}
        order = rng.permutation(len(unique))
        items = list(unique.values())
        out[c] = [items[i] for i in order]
    return out


def is_heldout(p: Prompt) -> bool:
    """The evaluation split. Explanations and math: by `corpus.is_heldout` of the document (or
    the problem's text), ~3 %. The smaller pools (coding, summarization, rewriting): 10 % of
    the prompts by the hash of their text, and the documents they come from are left out of
    the plain-text windows, so no held-out paragraph or docstring is trained on."""
    if p.category in ("explanation", "math"):
        return corpus.is_heldout(p.source)
    return int(hashlib.sha256(p.text.encode()).hexdigest()[:8], 16) % 100 < 10


def split_prompts(
    prompts: dict[str, list[Prompt]], plan: Plan
) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) prompts, `plan`'s number of each per category."""
    train, held = [], []
    for c in CATEGORIES:
        tr = [p for p in prompts[c] if not is_heldout(p)]
        ho = [p for p in prompts[c] if is_heldout(p)]
        if len(ho) < plan.heldout_per_category:
            raise RuntimeError(f"only {len(ho)} held-out {c} prompts")
        train += tr[: plan.prompts_per_category]
        held += ho[: plan.heldout_per_category]
    return train, held


def heldout_prompts(per_category: int = 12, seed: int = 0) -> list[Prompt]:
    """The held-out chat prompts (what the report and the benchmarks measure on)."""
    plan = dataclasses.replace(Plan(), heldout_per_category=per_category)
    return split_prompts(build_prompts(seed), plan)[1]
