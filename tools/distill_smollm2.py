#!/usr/bin/env python
"""Distill the W4A16 draft that ships for SmolLM2-135M-Instruct (`jaxspec.load("smollm2-draft")`).

One seeded command, everything from material on this machine (no download beyond the target's
own package, `jaxspec.load("smollm2")`):

1. Prompts: chat instructions in five categories (Spec-Bench's kinds) built from what every
   CPython carries: `coding` (write a function that does what a standard-library docstring
   says), `explanation` (what a module or a language feature is for), `summarization` and
   `rewriting` (of a paragraph of the pydoc topics), `math` (word problems from templates with
   seeded numbers). A prompt is held out (never trained on, used by the report and the
   benchmarks) iff its source document is held out by `train_default_models.is_heldout`
   (math: by the hash of its text).
2. Answers: the target answers every training prompt itself (`jaxspec.generate`, batched,
   half greedy, half at temperature 0.7), so the draft learns the text it will be asked to
   predict; plain text windows (pydoc topics, stdlib sources) come with them.
3. Teacher: one teacher-forced pass of the target over every sequence keeps the top-`k`
   log-probabilities of each position (ids int32, log-probs float16).
4. Draft: SmolLM2's tokenizer and vocabulary, a Llama of width 256 (`--width`, `--layers`),
   its tied embedding initialized from the principal components of the target's table.
   Loss: cross-entropy against the teacher's top-k distribution (renormalized), i.e. the KL
   to it up to a constant; AdamW, warmup and cosine decay; float32.
5. Shipped: quantized W4A16 (AQT int4, group 64; `--table int4|bf16` for the embedding/head
   table) and written in the packed form `jaxspec.load` reads back without re-quantizing,
   with `distill_report.json`: train/held-out KL, teacher-forced greedy agreement, alpha at
   gamma 4 (T=0 and T=0.7) measured by `jaxspec.generate` on the held-out prompts, the
   draft's cost per token over the target's, bytes, and the command that reproduces it.

    python tools/distill_smollm2.py --out jaxspec/ckpts/models/smollm2-draft --seed 0
    python tools/distill_smollm2.py --tiny --out /tmp/d   # a quick pass of every step
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import json
import pathlib
import platform
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_default_models as tdm  # the stdlib corpus and its held-out rule

CATEGORIES = ("coding", "explanation", "summarization", "math", "rewriting")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run does; `--tiny` is every step at a size that runs in a minute or two."""

    prompts_per_category: int = 120
    heldout_per_category: int = 12
    answer_tokens: int = 128
    answer_batch: int = 48
    plain_windows: int = 150
    seq_len: int = 320
    top_k: int = 32
    width: int = 256
    layers: int = 2
    steps: int = 300
    batch: int = 12
    lr: float = 2e-3
    warmup: int = 30
    eval_tokens: int = 96
    table: str = "int4"


TINY = Plan(
    prompts_per_category=3, heldout_per_category=2, answer_tokens=16, answer_batch=8,
    plain_windows=4, seq_len=64, top_k=8, width=64, layers=1, steps=6, batch=4, warmup=2,
    eval_tokens=12,
)  # fmt: skip


# ----------------------------------------------------------------------------- prompts


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


def _functions(doc: tdm.Doc) -> list[tuple[str, str]]:
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
    source = [d for d in tdm.stdlib_documents() if d.name.endswith(".py")]
    topics = tdm.pydoc_documents()
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
    """The evaluation split. Explanations and math: by `tdm.is_heldout` of the document (or
    the problem's text), ~3 %. The smaller pools (coding, summarization, rewriting): 10 % of
    the prompts by the hash of their text, and the documents they come from are left out of
    the plain-text windows, so no held-out paragraph or docstring is trained on."""
    if p.category in ("explanation", "math"):
        return tdm.is_heldout(p.source)
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


# ----------------------------------------------------------------------------- data


def answer(target: Any, prompts: list[tuple[int, ...]], plan: Plan, seed: int, bar: Any) -> Any:
    """The target's own answers (new tokens, EOS kept), half greedy, half at T=0.7."""
    import jaxspec

    answers: list[list[int]] = []
    for i in range(0, len(prompts), plan.answer_batch):
        chunk = [list(p) for p in prompts[i : i + plan.answer_batch]]
        temps = [0.0 if (i + j) % 2 == 0 else 0.7 for j in range(len(chunk))]
        out = jaxspec.generate(
            target, chunk, plan.answer_tokens, temperature=temps,
            seeds=[seed * 100003 + i + j for j in range(len(chunk))],
        )  # fmt: skip
        answers += out.tokens
        bar(len(chunk))
    return answers


def plain_windows(tokenizer: Any, plan: Plan, seed: int, held: list[Prompt]) -> list[list[int]]:
    """Windows of ordinary text (pydoc topics, stdlib sources): training documents only,
    none that a held-out prompt was built from."""
    rng = np.random.default_rng([seed, 7])
    exclude = {p.source for p in held}
    docs = [d for d in tdm.pydoc_documents() + tdm.stdlib_documents()]
    docs = [d for d in docs if not tdm.is_heldout(d.name) and d.name not in exclude]
    out = []
    for i in rng.permutation(len(docs)):
        ids = tokenizer.encode(docs[i].text, add_special_tokens=False)
        if len(ids) >= plan.seq_len:
            s = int(rng.integers(0, len(ids) - plan.seq_len + 1))
            out.append(ids[s : s + plan.seq_len])
        if len(out) == plan.plain_windows:
            break
    return out


def pad(seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """tokens [N, length] int32 (0-padded) and valid [N, length] bool."""
    toks = np.zeros((len(seqs), length), np.int32)
    valid = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        s = list(s)[:length]
        toks[i, : len(s)] = s
        valid[i, : len(s)] = True
    return toks, valid


def bucketize(seqs: Sequence[Sequence[int]], plan: Plan) -> dict[int, list[list[int]]]:
    """Sequences by length bucket (multiples of 64 up to `seq_len` inputs): batches of one
    bucket waste little on padding (chat sequences are ~half of `seq_len`)."""
    out: dict[int, list[list[int]]] = {}
    for s in seqs:
        s = list(s)[: plan.seq_len + 1]
        T = min(plan.seq_len, -(-(len(s) - 1) // 64) * 64)
        out.setdefault(T, []).append(s)
    return dict(sorted(out.items()))


def teacher_topk(
    target: Any, toks: np.ndarray, valid: np.ndarray, k: int, bar: Any, batch: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """The target's top-k next-token ids [N, T, k] int32 and log-probs [N, T, k] float16."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def top(params, t, v):
        B, T = t.shape
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        cache = target.init_cache(B, T)
        logits, _ = jaxspec_forward(target, params, t, pos, v, cache)
        logp = jax.nn.log_softmax(logits, axis=-1)
        vals, ids = jax.lax.top_k(logp, k)
        return ids, vals.astype(jnp.float16)

    ids_all, lp_all = [], []
    for i in range(0, len(toks), batch):
        t, v = toks[i : i + batch], valid[i : i + batch]
        n = len(t)
        if n < batch:  # one compiled shape
            t = np.concatenate([t, np.zeros((batch - n, t.shape[1]), np.int32)])
            v = np.concatenate([v, np.zeros((batch - n, v.shape[1]), bool)])
        ids, lp = top(target.params, t, v)
        ids_all.append(np.asarray(ids)[:n])
        lp_all.append(np.asarray(lp)[:n])
        bar(n)
    return np.concatenate(ids_all), np.concatenate(lp_all)


def jaxspec_forward(model: Any, params: Any, t: Any, pos: Any, v: Any, cache: Any) -> Any:
    return model.module.apply({"params": params}, t, pos, v, cache)


# ----------------------------------------------------------------------------- the draft


def draft_config(target_config: Any, plan: Plan) -> Any:
    heads = max(1, plan.width // 64)
    return dataclasses.replace(
        target_config, hidden_size=plan.width, intermediate_size=plan.width * 5 // 2,
        num_hidden_layers=plan.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=plan.width // heads,
    )  # fmt: skip


def init_draft(target: Any, config: Any, seed: int) -> Any:
    """Random layers; the tied table is the target's, projected on its `width` principal
    directions (so the draft starts out knowing which tokens are alike)."""
    import jax.numpy as jnp

    from jaxspec.nn.model import init_params

    params = init_params(config, seed=seed)
    table = np.asarray(target.params["embed_tokens"]["embedding"], np.float32)  # [V, 576]
    centered = table - table.mean(0)
    _, _, vt = np.linalg.svd(centered[:: max(1, len(table) // 8192)], full_matrices=False)
    proj = centered @ vt[: config.hidden_size].T  # [V, W]
    proj *= 0.02 / proj.std()
    return {**params, "embed_tokens": {"embedding": jnp.asarray(proj, jnp.float32)}}


def train_step_fn(config: Any, plan: Plan) -> Any:
    """Jitted (params, opt_state, tokens, valid, ids, logp, lr) -> (params, opt_state, loss)."""
    import jax
    import jax.numpy as jnp
    import optax

    import jaxspec

    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(b1=0.9, b2=0.95),
        optax.add_decayed_weights(0.05, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
    )

    def loss_fn(params, toks, valid, ids, logp):
        logq = jax.nn.log_softmax(logits_of(jaxspec, config, params, toks, valid), axis=-1)
        p = jnp.exp(logp.astype(jnp.float32))
        p = p / p.sum(-1, keepdims=True)
        ce = -jnp.sum(p * jnp.take_along_axis(logq, ids, axis=-1), axis=-1)
        w = valid.astype(jnp.float32)
        return jnp.sum(ce * w) / jnp.maximum(w.sum(), 1.0)

    @jax.jit
    def step(params, opt_state, toks, valid, ids, logp, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, toks, valid, ids, logp)
        updates, opt_state = opt.update(grads, opt_state, params)
        return jax.tree.map(lambda p, u: p - lr * u, params, updates), opt_state, loss

    return step, opt


def logits_of(jaxspec: Any, config: Any, params: Any, toks: Any, valid: Any) -> Any:
    import jax.numpy as jnp

    B, T = toks.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    cache = jaxspec.init_cache(config, B, T)
    logits, _ = jaxspec.Llama(config, kernels=False).apply(  # training: XLA's ops
        {"params": params}, toks, pos, valid, cache
    )
    return logits


def lr_at(step: int, plan: Plan) -> float:
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    frac = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    return plan.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, frac))))


def kl_and_agreement(
    model: Any, toks: np.ndarray, valid: np.ndarray, ids: np.ndarray, logp: np.ndarray,
    mask: np.ndarray, batch: int = 8,
) -> tuple[float, float]:  # fmt: skip
    """Teacher-forced KL(teacher top-k, renormalized || draft) and greedy agreement over the
    positions in `mask` (float32 model or a quantized one: its own forward)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def stats(params, t, v, i, lp):
        B, T = t.shape
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        logits, _ = model.module.apply({"params": params}, t, pos, v, model.init_cache(B, T))
        logq = jax.nn.log_softmax(logits, axis=-1)
        p = jnp.exp(lp.astype(jnp.float32))
        p = p / p.sum(-1, keepdims=True)
        kl = jnp.sum(p * (jnp.log(p + 1e-30) - jnp.take_along_axis(logq, i, axis=-1)), -1)
        return kl, jnp.argmax(logits, -1) == i[..., 0]

    kls, agree, count = 0.0, 0.0, 0
    for s in range(0, len(toks), batch):
        sl = slice(s, s + batch)
        kl, ok = stats(model.params, toks[sl], valid[sl], ids[sl], logp[sl])
        m = mask[sl]
        kls += float(np.sum(np.asarray(kl)[m]))
        agree += float(np.sum(np.asarray(ok)[m]))
        count += int(m.sum())
    return kls / max(1, count), agree / max(1, count)


def seconds_per_token(model: Any, prompt: list[int], new: int, repeats: int = 3) -> float:
    import jaxspec

    jaxspec.generate(model, prompt, new, temperature=0.0)  # compile
    runs = [jaxspec.generate(model, prompt, new, temperature=0.0) for _ in range(repeats)]
    return min(r.stats.wall_s for r in runs) / new


def alpha(target: Any, draft: Any, prompts: list[list[int]], new: int, temperature: float) -> Any:
    """(alpha, mean acceptance length, alpha per draft position) of co-located speculative
    decoding, gamma 4, over `prompts` (one batch)."""
    import jaxspec

    out = jaxspec.generate(
        target, prompts, new, draft=draft, gamma=4, temperature=temperature, seed=1,
        encoding="full",
    )  # fmt: skip
    f = out.stats.figures
    return f.acceptance_rate, f.mean_acceptance_length, list(f.per_position_acceptance)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default="smollm2")
    p.add_argument("--tiny", action="store_true", help="every step, minimal sizes")
    p.add_argument("--steps", type=int, help="training steps (default: the plan's)")
    p.add_argument("--prompts-per-category", type=int)
    p.add_argument("--table", choices=("int4", "bf16"), help="the embedding/head table")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--keep-float", type=pathlib.Path, help="also save the float32 draft here")
    return p.parse_args(argv)


@dataclasses.dataclass
class Run:
    """What the steps of `main` share: the command line, the plan, the log and the clock,
    the phase times, and the target."""

    argv: Sequence[str] | None
    args: argparse.Namespace
    plan: Plan
    log: Any
    t_start: float
    times: dict[str, float]
    target: Any


@dataclasses.dataclass
class Chat:
    """The training and held-out prompts, and their chat-formatted token ids."""

    train_p: list[Prompt]
    held_p: list[Prompt]
    train_ids: list[Any]
    held_ids: list[Any]


@dataclasses.dataclass
class Teacher:
    """The training sequences, the teacher's top-k of them per length bucket T (inputs
    [n, T], valid [n, T], ids, log-probs), and the held-out sequences with theirs."""

    seqs: list[list[int]]
    data: dict[int, tuple[np.ndarray, ...]]
    positions: dict[int, int]
    n_positions: int
    htoks: np.ndarray
    hvalid: np.ndarray
    hmask: np.ndarray
    hids: np.ndarray
    hlogp: np.ndarray


def start_run(argv: Sequence[str] | None) -> Run:
    """Parse the command line, make the plan, load the target."""
    args = parse_args(argv)
    plan = TINY if args.tiny else Plan()
    changes = {"steps": args.steps, "prompts_per_category": args.prompts_per_category,
               "table": args.table}  # fmt: skip
    plan = dataclasses.replace(plan, **{k: v for k, v in changes.items() if v is not None})
    log = tdm.Logger(progress=not args.no_progress)
    t_start = time.time()
    times: dict[str, float] = {}

    import jaxspec

    target = jaxspec.load(args.target)
    log.log(f"target {args.target}: {target.num_params() / 1e6:.1f}M params")
    return Run(argv, args, plan, log, t_start, times, target)


def make_prompts(run: Run) -> Chat:
    """1. prompts"""
    import jaxspec

    target = run.target
    train_p, held_p = split_prompts(build_prompts(run.args.seed), run.plan)
    train_ids = [jaxspec.chat_prompt(target, p.text) for p in train_p]
    held_ids = [jaxspec.chat_prompt(target, p.text) for p in held_p]
    run.log.log(
        f"{len(train_p)} training prompts, {len(held_p)} held out ({len(CATEGORIES)} kinds)"
    )
    return Chat(train_p, held_p, train_ids, held_ids)


def answer_prompts(run: Run, chat: Chat) -> tuple[Any, Any, int]:
    """2. answers (held-out: greedy, for the teacher-forced figures): (training answers,
    held-out answers, training answer tokens)."""
    import jaxspec

    target, plan, log = run.target, run.plan, run.log
    train_ids, held_ids = chat.train_ids, chat.held_ids
    t0 = time.time()
    with log.progress() as prog:
        task = prog.add_task("target answers", total=len(train_ids) + len(held_ids), info="")
        bar = lambda n: prog.advance(task, n)  # noqa: E731
        train_ans = answer(target, train_ids, plan, run.args.seed, bar)
        held_plan = dataclasses.replace(plan, answer_batch=len(held_ids))
        held_ans = jaxspec.generate(
            target, [list(p) for p in held_ids], held_plan.answer_tokens, temperature=0.0
        ).tokens
        bar(len(held_ids))
    run.times["answers_s"] = time.time() - t0
    n_ans = sum(map(len, train_ans))
    log.log(f"answers: {n_ans} tokens in {run.times['answers_s']:.0f} s")
    return train_ans, held_ans, n_ans


def _answer_mask(held_ids: list[Any], held_seqs: list[list[int]], hvalid: np.ndarray) -> Any:
    """The answer positions (predicting answer tokens) of the held-out sequences."""
    hmask = np.zeros_like(hvalid)
    for i, p in enumerate(held_ids):
        hmask[i, len(p) - 1 : len(held_seqs[i]) - 1] = True
    hmask &= hvalid
    return hmask


def teach(run: Run, chat: Chat, train_ans: Any, held_ans: Any) -> Teacher:
    """3. teacher top-k"""
    target, plan, log = run.target, run.plan, run.log
    train_ids, held_ids = chat.train_ids, chat.held_ids
    t0 = time.time()
    chat_seqs = [list(p) + list(a) for p, a in zip(train_ids, train_ans, strict=True)]
    seqs = chat_seqs + plain_windows(target.tokenizer, plan, run.args.seed, chat.held_p)
    held_seqs = [list(p) + list(a) for p, a in zip(held_ids, held_ans, strict=True)]
    htoks, hvalid = pad(held_seqs, plan.seq_len + 1)
    hmask = _answer_mask(held_ids, held_seqs, hvalid)
    # per bucket T: inputs [n, T], valid [n, T] (position t counts when t+1 exists), top-k
    data: dict[int, tuple[np.ndarray, ...]] = {}
    with log.progress() as prog:
        task = prog.add_task("teacher top-k", total=len(seqs) + len(held_seqs), info="")
        bar = lambda n: prog.advance(task, n)  # noqa: E731
        for T, group in bucketize(seqs, plan).items():
            toks, valid = pad(group, T + 1)
            batch = max(1, 2560 // T)
            ids, logp = teacher_topk(target, toks[:, :-1], valid[:, :-1], plan.top_k, bar, batch)
            data[T] = (toks[:, :-1], valid[:, :-1] & valid[:, 1:], ids, logp)
        hids, hlogp = teacher_topk(target, htoks[:, :-1], hvalid[:, :-1], plan.top_k, bar)
    run.times["teacher_s"] = time.time() - t0
    hmask = hmask[:, :-1]
    positions = {T: int(d[1].sum()) for T, d in data.items()}
    n_positions = sum(positions.values())
    log.log(f"teacher: {n_positions} positions in {run.times['teacher_s']:.0f} s ({positions})")
    return Teacher(seqs, data, positions, n_positions, htoks, hvalid, hmask, hids, hlogp)


def distill(run: Run, teacher: Teacher) -> tuple[Any, Any, list[tuple[int, float]]]:
    """4. train: (draft config, params, losses)."""
    args, plan, log = run.args, run.plan, run.log
    data, positions = teacher.data, teacher.positions
    t0 = time.time()
    config = draft_config(run.target.config, plan)
    params = init_draft(run.target, config, args.seed)
    step_fn, opt = train_step_fn(config, plan)
    opt_state = opt.init(params)
    rng = np.random.default_rng([args.seed, 4])
    losses = []
    sizes = list(data)
    weights = np.array([positions[T] for T in sizes], float) / teacher.n_positions
    with log.progress() as prog:
        task = prog.add_task("distill", total=plan.steps, info="")
        for step in range(plan.steps):
            T = sizes[rng.choice(len(sizes), p=weights)]  # same tokens per step in every bucket
            x, v, i, lp = data[T]
            b = rng.integers(0, len(x), size=max(1, plan.batch * plan.seq_len // T))
            params, opt_state, loss = step_fn(
                params, opt_state, x[b], v[b], i[b], lp[b], lr_at(step, plan)
            )
            if step % 10 == 0 or step == plan.steps - 1:
                losses.append((step, float(loss)))
                prog.update(task, info=f"loss {float(loss):.3f}")
                if not log.progress_enabled and step % 50 == 0:
                    log.log(f"step {step}/{plan.steps}: loss {float(loss):.3f}")
            prog.advance(task)
    run.times["train_s"] = time.time() - t0
    log.log(f"trained {plan.steps} steps in {run.times['train_s']:.0f} s, loss {losses[-1][1]:.3f}")
    return config, params, losses


def _teacher_forced_figures(
    report: dict[str, Any], draft: Any, loaded: Any, teacher: Teacher, log: Any
) -> None:
    """Train/held-out KL and greedy agreement of the float32 and the shipped draft."""
    data = teacher.data
    for name, m in (("float32", draft), ("w4a16", loaded)):
        tr = [kl_and_agreement(m, *(a[:16] for a in d), d[1][:16]) for d in data.values()]
        w = [d[1][:16].sum() for d in data.values()]
        tr_kl, tr_agree = (float(np.average([r[j] for r in tr], weights=w)) for j in (0, 1))
        ho_kl, ho_agree = kl_and_agreement(
            m, teacher.htoks[:, :-1], teacher.hvalid[:, :-1], teacher.hids, teacher.hlogp,
            teacher.hmask,
        )  # fmt: skip
        report[name] = {
            "train_kl": tr_kl, "heldout_kl": ho_kl,
            "train_greedy_agreement": tr_agree, "heldout_greedy_agreement": ho_agree,
        }  # fmt: skip
        log.log(f"{name}: held-out KL {ho_kl:.3f}, greedy agreement {ho_agree:.3f}")


def _acceptance_figures(
    report: dict[str, Any], run: Run, loaded: Any, chat: Chat, prompts: list[list[int]]
) -> None:
    """Alpha of the shipped draft at T=0 and T=0.7, and at T=0 per category."""
    target, plan, log = run.target, run.plan, run.log
    for t in (0.0, 0.7):
        a, acc, per = alpha(target, loaded, prompts, plan.eval_tokens, t)
        report[f"alpha_t{str(t).replace('.', '')}"] = a
        report[f"mean_acceptance_length_t{str(t).replace('.', '')}"] = acc
        report[f"alpha_per_position_t{str(t).replace('.', '')}"] = per
        log.log(f"alpha at T={t}: {a:.3f} (mean acceptance length {acc:.2f}, gamma 4)")
    per_cat = {}
    for c in CATEGORIES:
        sel = [i for i, p in enumerate(chat.held_p) if p.category == c]
        a, acc, _ = alpha(target, loaded, [prompts[i] for i in sel], plan.eval_tokens, 0.0)
        per_cat[c] = {"alpha_t0": a, "mean_acceptance_length_t0": acc}
    report["by_category"] = per_cat


def ship_and_evaluate(
    run: Run, chat: Chat, teacher: Teacher, config: Any, params: Any
) -> tuple[pathlib.Path, dict[str, Any]]:
    """5. quantize, save, evaluate what ships: (staging dir, report so far)."""
    import jaxspec

    args, plan, log, target = run.args, run.plan, run.log, run.target
    t0 = time.time()
    draft = jaxspec.Model(
        config=config, params=params, tokenizer=target.tokenizer, name="smollm2-draft"
    )
    if args.keep_float is not None:
        jaxspec.save(draft, args.keep_float)
    shipped = jaxspec.quantize(draft, "w4a16", 64, method="rtn", embeddings=plan.table == "int4")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix="distill-", dir=args.out.parent))
    jaxspec.save(shipped, staging)
    loaded = jaxspec.load(staging)
    report: dict[str, Any] = {"plan": dataclasses.asdict(plan), "seed": args.seed}
    _teacher_forced_figures(report, draft, loaded, teacher, log)
    prompts = [list(p) for p in chat.held_ids]
    _acceptance_figures(report, run, loaded, chat, prompts)
    probe = list(chat.held_ids[0])
    t_target = seconds_per_token(target, probe, 32)
    t_draft = seconds_per_token(loaded, probe, 32)
    report["draft_cost_ratio"] = t_draft / t_target
    report["target_ms_per_token"] = t_target * 1e3
    report["draft_ms_per_token"] = t_draft * 1e3
    run.times["evaluate_s"] = time.time() - t0
    log.log(f"draft cost: {t_draft / t_target:.3f} of a target token")
    return staging, report


def finish(
    run: Run,
    staging: pathlib.Path,
    report: dict[str, Any],
    chat: Chat,
    teacher: Teacher,
    params: Any,
    losses: list[tuple[int, float]],
    n_ans: int,
) -> None:
    """The rest of the report; write it and move the staging dir into place."""
    import jax
    import jax.numpy as jnp

    args, argv = run.args, run.argv
    report.update(
        draft_params=int(sum(v.size for v in jax.tree.leaves(params))),
        shipped_bytes=sum(f.stat().st_size for f in staging.iterdir()),
        weights_bytes=(staging / "model.safetensors").stat().st_size,
        train_sequences=len(teacher.seqs), train_positions=teacher.n_positions,
        answer_tokens=n_ans, heldout_prompts=[dataclasses.asdict(p) for p in chat.held_p],
        losses=losses, times=run.times, total_s=time.time() - run.t_start,
        reproduce_command="python tools/distill_smollm2.py " + shlex.join(
            [str(a) for a in (argv if argv is not None else sys.argv[1:])]
        ),
        machine=f"{platform.machine()}, {jax.device_count()} {jax.default_backend()} device(s)",
        versions={"jax": jax.__version__, "python": platform.python_version()},
        float_dtype=str(jnp.float32.dtype),
    )  # fmt: skip
    (staging / "distill_report.json").write_text(json.dumps(report, indent=1) + "\n")
    if args.out.exists():
        shutil.rmtree(args.out)
    staging.rename(args.out)
    run.log.log(f"wrote {args.out} ({report['shipped_bytes'] / 2**20:.1f} MB) in "
                f"{report['total_s'] / 60:.1f} min")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    run = start_run(argv)
    chat = make_prompts(run)
    train_ans, held_ans, n_ans = answer_prompts(run, chat)
    teacher = teach(run, chat, train_ans, held_ans)
    config, params, losses = distill(run, teacher)
    staging, report = ship_and_evaluate(run, chat, teacher, config, params)
    finish(run, staging, report, chat, teacher, params, losses, n_ans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
