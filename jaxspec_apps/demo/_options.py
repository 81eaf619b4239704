"""`jaxspec demo`'s options: the flags in the order `--help` lists them (tenants and the
simulated link, what each tenant samples, the verifier and the draft, the output), and the
checks that refuse nonsense before anything starts."""

from __future__ import annotations

import argparse

from edge.client import channel_target
from jaxspec_host import flags

MAX_TENANTS = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `jaxspec demo` options (the CLI calls this while building its parser), in the
    order `--help` lists them."""
    p.description = "Live view of edge tenants drafting against a verifier service."
    p.formatter_class = flags.HelpFormatter
    _add_tenant_flags(p)
    _add_generation_flags(p)
    _add_verifier_flags(p)
    _add_output_flags(p)


def _add_tenant_flags(p: argparse.ArgumentParser) -> None:
    """How many tenants, how they draft, and the simulated link between them and the verifier."""
    p.add_argument(
        "--num-tenants",
        dest="tenants",
        metavar="N",
        type=int,
        default=3,
        help="edge tenants, each its own session and channel (`--tenants` of `python -m verify "
        "serve` is its tenants file, a different thing)",
    )
    flags.add_speculation_flags(p, q_dtype=None, encoding=False)  # --gamma ... --depth
    flags.add_cache_flag(p)
    p.add_argument("--rtt-ms", type=float, default=50.0, help="simulated round trip in ms")
    p.add_argument("--jitter-ms", type=float, default=5.0, help="± on the round trip in ms")


def _add_generation_flags(p: argparse.ArgumentParser) -> None:
    """What each tenant samples: sampling values, prompts, length, and for how long."""
    flags.add_sampling_flags(
        p,
        temperature=0.7,
        top_k=None,
        top_p=None,
        min_p=None,
        logit_bias=None,
        helps={"seed": "tenant i samples with seed + i"},
    )
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="prompt (repeat for several; tenants take them in turn); default: chat questions "
        "with SmolLM2, prose and code openings with Gemma, Python code with the tiny pair",
    )
    flags.add_max_new_tokens(p, 160, what=" per tenant and sample")
    p.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="generate for this long once started, each tenant beginning a new sample (next "
        "seed) when one ends; 0 (default): one sample per tenant, then stop",
    )


def _add_verifier_flags(p: argparse.ArgumentParser) -> None:
    """Which verifier (a running one, or one spawned with which target), and the draft."""
    flags.add_client_flags(p, "demo")  # --verifier (none: one is spawned), --token
    flags.add_model_flags(p, "demo")  # --checkpoint --draft --pair --quantize
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the spawned verifier compiles every batch shape of its pool (one slot per "
        "tenant) before serving (default; the tenants start together, so they need them at "
        "once); --no-warmup compiles each on first use (requests stall on each new shape)",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the run is shown: live or a plain summary, and screen captures."""
    p.add_argument("--plain", action="store_true", help="no live view: print a summary at the end")
    p.add_argument(
        "--capture",
        action="append",
        default=None,
        metavar="FILE",
        help="save the screen as the run ends: SVG for a .svg name, else text "
        "(the terminal's size; 80x24 without one); repeatable",
    )


def check_options(args: argparse.Namespace) -> None:
    """Refuse nonsense before anything starts (the CLI prints ValueErrors cleanly)."""
    flags.check_args(args)  # sampling values, seed, depth, the DraftSpec: the library checks
    flags.refuse_draft_without_speculation(args)
    if not 1 <= args.tenants <= MAX_TENANTS:
        raise ValueError(f"--num-tenants must be in [1, {MAX_TENANTS}], got {args.tenants}")
    if args.gamma != flags.AUTO and not 0 <= args.gamma <= 16:
        raise ValueError("--gamma must be in [0, 16] (0: speculation off) or auto")
    if args.depth < 1:
        raise ValueError("--depth must be >= 1")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.rtt_ms < 0 or args.jitter_ms < 0 or args.jitter_ms > args.rtt_ms:
        raise ValueError("--rtt-ms and --jitter-ms must be >= 0, jitter at most the RTT")
    if args.seconds < 0:
        raise ValueError("--seconds must be >= 0")
    if args.prompt is not None and not all(p for p in args.prompt):
        raise ValueError("--prompt must not be empty")
    if args.verifier is not None:
        channel_target(args.verifier)  # a malformed address, a port outside [1, 65535]
