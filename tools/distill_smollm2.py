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
import dataclasses
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
from trainlib.distill_data import answer, bucketize, pad, plain_windows, teacher_topk
from trainlib.distill_plan import TINY, Plan
from trainlib.draft_model import (
    alpha,
    draft_config,
    init_draft,
    kl_and_agreement,
    lr_at,
    seconds_per_token,
    train_step_fn,
)
from trainlib.logger import Logger
from trainlib.prompts import (
    CATEGORIES,
    Prompt,
    build_prompts,
    heldout_prompts,
    is_heldout,
    split_prompts,
)

# What tests/test_distill_tool.py uses of this script, by these names.
__all__ = [
    "CATEGORIES", "Plan", "bucketize", "build_prompts", "heldout_prompts", "is_heldout", "main",
    "pad", "split_prompts",
]  # fmt: skip


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
    log = Logger(progress=not args.no_progress)
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
