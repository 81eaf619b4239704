#!/usr/bin/env python
"""Quantized drafts, measured: held-out perplexity, acceptance alpha, resident bytes, speed.

For each quantization variant (none / w8a16 / w4a16 per-channel and group-wise / w4a16 with
bf16 embeddings / w4a4) of two drafts of the shipped default target:

- "draft": the shipped draft (`jaxspec.load("default-draft")`) quantized;
- "self":  the target itself quantized (self-speculation),

it reports
- resident bytes (`model.nbytes()`) and their ratio to the same model in bf16;
- held-out perplexity and its change against the unquantized model, on the documents that
  `tools/train_default_models.py` held out of training (its `build_corpus` and hash rule,
  imported, not copied), windows of 256 tokens as in its evaluation;
- acceptance alpha of `jaxspec.generate(target, prompts, n, draft=quantized, gamma=4)` at
  temperature 0 and 1 (the float target verifies; prompts are held-out windows);
- the edge drafter's (`edge.drafter`) draft tokens/s at batch 1, w4a16 next to bf16 with
  bf16 activations for both, timed in alternation in one run.

The metrics are `jaxspec_apps.bench.quality`'s, which `jaxspec bench` runs in short form.

Writes `<out>.md` (the tables of docs/benchmarks.md) and `<out>.json` (everything, with the
command).

    python tools/quality_w4a16.py --out quality_w4a16      # the default pair (~8 min, 2 cores)
    python tools/quality_w4a16.py --tiny --out /tmp/q      # random tiny models (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pathlib
import platform
import shlex
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from trainlib.corpus import build_corpus, encode_docs  # noqa: E402
from trainlib.evaluation import windows as split_windows  # noqa: E402
from trainlib.presets import FULL as FULL_PRESET  # noqa: E402
from trainlib.presets import TINY as TINY_PRESET  # noqa: E402

import jaxspec  # noqa: E402
from edge.drafter import Drafter  # noqa: E402
from jaxspec.ckpts.tiny import byte_tokenizer, tiny_config, to_dtype  # noqa: E402
from jaxspec.decoding.sampling import SamplingParams, session_keys  # noqa: E402
from jaxspec.protocol import DraftSpec  # noqa: E402
from jaxspec_apps.bench.quality import acceptance, batches, heldout_metrics, target_logp  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Variant:
    scheme: str
    group: int | None = None
    embeddings: bool = True

    @property
    def label(self) -> str:
        if self.scheme == "none":
            return "none (float32)"
        g = "per-channel" if self.group is None else f"g{self.group}"
        return f"{self.scheme} {g}" + ("" if self.embeddings else ", embeddings bf16")


FULL_VARIANTS = [
    Variant("none"),
    Variant("w8a16", 128),
    Variant("w4a16", None),
    Variant("w4a16", 128),
    Variant("w4a16", 32),
    Variant("w4a16", 128, embeddings=False),
    Variant("w4a4", 128),
]
TINY_VARIANTS = [Variant("none"), Variant("w4a16", 16)]


@dataclasses.dataclass(frozen=True)
class Settings:
    seq_len: int
    windows: int  # per held-out kind (source, docs)
    eval_batch: int
    prompts: int
    prompt_len: int
    new_tokens: int
    gamma: int
    speed_blocks: int
    speed_reps: int
    speed_prompt_len: int


FULL = Settings(256, 24, 8, 16, 32, 48, 4, 32, 3, 64)
TINY = Settings(32, 2, 2, 2, 8, 6, 2, 4, 1, 8)


def heldout_streams(tokenizer: Any, tiny: bool) -> dict[str, np.ndarray]:
    """Token streams of the held-out documents of `tools/train_default_models.py`'s split, one
    per kind ("source", "docs")."""
    _, held = build_corpus(TINY_PRESET if tiny else FULL_PRESET)
    streams = {}
    for kind in ("source", "docs"):
        docs = [d for d in held if d.kind == kind]
        if docs:
            streams[kind] = encode_docs(tokenizer, docs).astype(np.int32)
    return streams


def weights_digest(name: str) -> str | None:
    """sha256 (first 16 hex) of a checkpoint's weights, to tell which models were measured."""
    from jaxspec.ckpts.checkpoint import BUILTIN_DIR, BUILTIN_NAMES

    d = pathlib.Path(name)
    if not d.is_dir() and name in BUILTIN_NAMES:
        d = BUILTIN_DIR / BUILTIN_NAMES[name]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def tiny_pair() -> tuple[jaxspec.Model, jaxspec.Model]:
    tok = byte_tokenizer()
    ends = dict(bos_token_id=tok.bos_token_id, eos_token_ids=(tok.eos_token_id,))
    # One config for both (different weights): the self rows then reuse the draft rows'
    # compilations, which is most of the tiny run's time.
    tcfg = dcfg = tiny_config(vocab_size=len(tok), tie_word_embeddings=True, **ends)

    def make(cfg, seed):  # spread weights: distributions far from uniform
        params = jax.tree.map(lambda a: 3 * a, jaxspec.init_params(cfg, seed))
        return jaxspec.Model(config=cfg, params=params, tokenizer=tok, name=f"tiny-{seed}")

    return make(tcfg, 0), make(dcfg, 1)


# ----------------------------------------------------------------------------- metrics


def drafter_speed(models: dict[str, jaxspec.Model], prompt: list[int], s: Settings) -> dict:
    """Draft tokens/s at batch 1 (full q, temperature 1): blocks of gamma drafts, each
    followed by a verdict (half accepted, one correction appended), timed per `draft` call;
    the models take turns so that machine noise hits them alike."""
    max_len = len(prompt) + s.speed_blocks * (s.gamma + 1) + s.gamma + 8
    sp, keys = SamplingParams.make(1, temperature=1.0), session_keys(0, 1)
    spec = DraftSpec(gamma=s.gamma, encoding="full")
    drafters = {k: Drafter(m, spec) for k, m in models.items()}

    def run(d: Drafter) -> float:
        st = d.prefill(d.init(1, max_len), [prompt])
        spent = 0.0
        for _ in range(s.speed_blocks):
            t0 = time.perf_counter()
            st, blk = d.draft(st, sp, keys)
            blk.tokens.block_until_ready()
            spent += time.perf_counter() - t0
            keep = blk.start + s.gamma // 2
            st = d.append(d.rollback(st, [0], keep), [0], blk.tokens[:, :1])
        return s.speed_blocks * s.gamma / spent

    for d in drafters.values():
        run(d)  # compile
    rates: dict[str, list[float]] = {k: [] for k in drafters}
    for _ in range(s.speed_reps):
        for k, d in drafters.items():
            rates[k].append(run(d))
    return {k: statistics.median(v) for k, v in rates.items()}


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="quality_w4a16", help="writes <out>.md and <out>.json")
    p.add_argument("--tiny", action="store_true", help="random tiny models, seconds (CI)")
    p.add_argument("--target", default="default", help="target checkpoint (or built-in name)")
    p.add_argument("--draft", default="default-draft", help="draft checkpoint (or name)")
    p.add_argument("--windows", type=int, help="held-out windows per kind")
    p.add_argument("--prompts", type=int, help="prompts for the acceptance runs")
    p.add_argument("--new-tokens", type=int, help="new tokens per acceptance run")
    p.add_argument("--no-self", action="store_true", help="skip self-speculation rows")
    return p.parse_args(argv)


@dataclasses.dataclass
class Run:
    """What the steps of `main` share: the command line, the settings, the variants, the
    clock of the log lines."""

    argv: list[str] | None
    args: argparse.Namespace
    s: Settings
    variants: list[Variant]
    t_start: float

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t_start:6.1f}s] {msg}", flush=True)


@dataclasses.dataclass
class Heldout:
    """The held-out token streams per kind, their evaluation windows, the prompts."""

    streams: dict[str, np.ndarray]
    windows: dict[str, np.ndarray]
    prompts: list[list[int]]


def start_run(argv: list[str] | None) -> Run:
    """Parse the command line into the settings and variants; start the clock."""
    args = parse_args(argv)
    t_start = time.time()
    s = TINY if args.tiny else FULL
    s = dataclasses.replace(
        s,
        windows=args.windows or s.windows,
        prompts=args.prompts or s.prompts,
        new_tokens=args.new_tokens or s.new_tokens,
    )
    variants = TINY_VARIANTS if args.tiny else FULL_VARIANTS
    return Run(argv, args, s, variants, t_start)


def load_heldout(run: Run, target: jaxspec.Model) -> Heldout:
    """The held-out streams (tokenized by the target), windows of them, and prompts."""
    s = run.s
    streams = heldout_streams(target.tokenizer, run.args.tiny)
    windows = {k: split_windows(v, s.seq_len + 1, s.windows) for k, v in streams.items()}
    rng = np.random.RandomState(0)
    prompts = []
    for i in range(s.prompts):  # alternate kinds; random windows of held-out text
        stream = list(streams.values())[i % len(streams)]
        start = rng.randint(0, len(stream) - s.prompt_len)
        prompts.append(stream[start : start + s.prompt_len].tolist())
    run.log(
        f"held out: {', '.join(f'{k} {len(v):,} tokens' for k, v in streams.items())}; "
        f"{sum(len(w) for w in windows.values())} windows of {s.seq_len}, {len(prompts)} prompts"
    )
    return Heldout(streams, windows, prompts)


def _family_rows(
    run: Run,
    target: jaxspec.Model,
    family: str,
    base: jaxspec.Model,
    evals: list[Any],
    prompts: list[list[int]],
) -> list[dict[str, Any]]:
    """One row per variant of `base` quantized: bytes, held-out figures, acceptance."""
    s = run.s
    rows = []
    bf16_bytes = 2 * base.num_params()
    base_ppl = None
    for v in run.variants:
        t0 = time.time()
        model = jaxspec.quantize(base, v.scheme, v.group, method="rtn", embeddings=v.embeddings)
        held = heldout_metrics(model, evals)
        base_ppl = held["ppl"] if v.scheme == "none" else base_ppl
        row = {
            "family": family,
            "variant": v.label,
            "scheme": v.scheme,
            "group_size": v.group,
            "embeddings_quantized": v.embeddings and v.scheme != "none",
            "num_params": base.num_params(),
            "resident_bytes": model.nbytes(),
            "bytes_vs_bf16": model.nbytes() / bf16_bytes,
            **held,
            "ppl_change": held["ppl"] / base_ppl - 1,
        }
        if not (family == "self" and v.scheme == "none"):  # the target drafting itself
            row |= acceptance(target, model, prompts, s.new_tokens, s.gamma)
        rows.append(row)
        run.log(
            f"{family:5s} {v.label:32s} {row['bytes_vs_bf16']:.3f}x bf16  ppl "
            f"{held['ppl']:8.2f} ({100 * row['ppl_change']:+.1f}%)  agree "
            f"{held['greedy_agreement']:.3f} E[a] {held['expected_alpha_t1']:.3f}  alpha "
            f"{row.get('alpha_t0', float('nan')):.3f}/{row.get('alpha_t1', float('nan')):.3f}"
            f"  ({time.time() - t0:.0f} s)"
        )
    return rows


def quantized_rows(
    run: Run,
    target: jaxspec.Model,
    families: list[tuple[str, jaxspec.Model]],
    heldout: Heldout,
) -> list[dict[str, Any]]:
    """The rows of every family and variant, against the float target's log-probs."""
    evals = [  # the float target's log-probs, once: the reference of every variant
        (kind, b, rows, target_logp(target.module, target.params, b))
        for kind, b, rows in batches(heldout.windows, run.s.eval_batch)
    ]
    rows = []
    for family, base in families:
        rows += _family_rows(run, target, family, base, evals, heldout.prompts)
    return rows


def drafter_speeds(
    run: Run, families: list[tuple[str, jaxspec.Model]], prompts: list[list[int]]
) -> dict[str, Any]:
    """The edge drafter's tokens/s, bf16 and w4a16 g128, per family."""
    s = run.s
    speed_prompt = prompts[0][: s.speed_prompt_len]
    speed = {}
    for family, base in families[:1] if run.args.tiny else families:  # tiny: compile less
        bf16 = to_dtype(base, jnp.bfloat16)
        models = {"bf16": bf16, "w4a16 g128": jaxspec.quantize(bf16, "w4a16", 128, method="rtn")}
        rates = drafter_speed(models, speed_prompt, s)
        speed[family] = {
            "tokens_per_s": rates,
            "ratio_w4a16_over_bf16": rates["w4a16 g128"] / rates["bf16"],
        }
        run.log(f"drafter {family}: {rates} -> ratio {speed[family]['ratio_w4a16_over_bf16']:.2f}")
    return speed


def build_report(
    run: Run,
    target: jaxspec.Model,
    draft: jaxspec.Model,
    heldout: Heldout,
    rows: list[dict[str, Any]],
    speed: dict[str, Any],
) -> dict[str, Any]:
    """`<out>.json`: everything, with the command."""
    args, argv = run.args, run.argv
    cmd = ["python", "tools/quality_w4a16.py", *(sys.argv[1:] if argv is None else argv)]
    return {
        "command": shlex.join(cmd),
        "target": args.target if not args.tiny else "tiny random",
        "draft": args.draft if not args.tiny else "tiny random",
        "weights_sha256": None
        if args.tiny
        else {"target": weights_digest(args.target), "draft": weights_digest(args.draft)},
        "target_params": target.num_params(),
        "draft_params": draft.num_params(),
        "settings": dataclasses.asdict(run.s),
        "heldout": {
            "source": "tools/train_default_models.py build_corpus(): held-out documents",
            "tokens": {k: len(v) for k, v in heldout.streams.items()},
            "windows": {k: len(v) for k, v in heldout.windows.items()},
        },
        "rows": rows,
        "drafter_speed": speed,
        "wall_time_s": time.time() - run.t_start,
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "machine": f"{platform.machine()}",
        },
    }


def write_outputs(run: Run, report: dict[str, Any]) -> None:
    out = pathlib.Path(run.args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    run.log(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")


def main(argv: list[str] | None = None) -> int:
    run = start_run(argv)
    if run.args.tiny:
        target, draft = tiny_pair()
    else:
        target, draft = jaxspec.load(run.args.target), jaxspec.load(run.args.draft)
    heldout = load_heldout(run, target)
    families = [("draft", draft)] + ([] if run.args.no_self else [("self", target)])
    rows = quantized_rows(run, target, families, heldout)
    speed = drafter_speeds(run, families, heldout.prompts)
    write_outputs(run, build_report(run, target, draft, heldout, rows, speed))
    return 0


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def markdown(r: dict) -> str:
    s = r["settings"]
    n_win = sum(r["heldout"]["windows"].values())
    lines = [
        f"Held-out: {n_win} windows of {s['seq_len']} tokens from the documents that "
        "`tools/train_default_models.py` held out of training. *ppl*: perplexity, *Δ ppl* "
        "against the same model unquantized; *agree*: teacher-forced greedy agreement with "
        "the float target, *E[α]*: teacher-forced expected acceptance at T=1 (mean of "
        "sum_x min(p, q)); *α*: measured acceptance of `jaxspec.generate(target, prompts, "
        f"{s['new_tokens']}, draft=..., gamma={s['gamma']})` on {s['prompts']} held-out "
        f"prompts of {s['prompt_len']} tokens (the float target verifies; accepted / drafted, "
        "vLLM's definition: drafts after a rejection count as drafted, so a per-position "
        "acceptance a gives about a(1 - a^γ) / ((1 - a) γ)). *resident*: "
        "`model.nbytes()`, and relative to the same model in bf16. *draft*: the shipped "
        "draft quantized; *self*: the target quantized (self-speculation); *none* is the "
        "float32 model as loaded.",
        "",
        "| draft | quantization | resident | × bf16 | ppl | Δ ppl | agree | E[α] T=1 "
        "| α T=0 | α T=1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f3(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    for row in r["rows"]:
        lines.append(
            f"| {row['family']} | {row['variant']} | {_size(row['resident_bytes'])} | "
            f"{row['bytes_vs_bf16']:.3f} | {row['ppl']:.2f} | {100 * row['ppl_change']:+.1f}% | "
            f"{f3(row['greedy_agreement'])} | {f3(row['expected_alpha_t1'])} | "
            f"{f3(row.get('alpha_t0'))} | {f3(row.get('alpha_t1'))} |"
        )
    lines += [
        "",
        f"Edge drafter (`edge.drafter`, batch 1, gamma {s['gamma']}, full q, bf16 "
        "activations): draft tokens/s, both timed in alternation in one run:",
        "",
        "| draft | bf16 | w4a16 g128 | w4a16 / bf16 |",
        "|---|---:|---:|---:|",
    ]
    for family, v in r["drafter_speed"].items():
        t = v["tokens_per_s"]
        lines.append(
            f"| {family} | {t['bf16']:.0f} | {t['w4a16 g128']:.0f} | "
            f"{v['ratio_w4a16_over_bf16']:.2f} |"
        )
    lines += ["", f"`{r['command']}` ({r['wall_time_s']:.0f} s)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    jax.config.update("jax_numpy_rank_promotion", "raise")
    sys.exit(main())
