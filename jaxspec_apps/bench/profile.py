"""Benchmark sizes (stdlib only). `full` is the committed report: the shipped tiny pair at
these sizes, then the real pair (SmolLM2 and its W4A16 draft) at the `real` sizes; `quick`
keeps CI honest in under two minutes; `tiny` is for tests with tiny random checkpoints.

Every field can be set for one run (`jaxspec bench --set NAME=VALUE`, `with_settings`). The
fields of a section that runs only when named (`--sections adaptive`, ...) carry that
section's name in their metadata: they are recorded in the section's own results, not in
`profile_settings` (`suite_settings`)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

SECTIONS = ("colocated", "peer", "capacity", "latency", "verifier", "wirecost", "quality")
SELF_DRAFT = "smollm2-w4a16"  # the real pair's draft: SmolLM2's own W4A16 copy
SMALL_DRAFT = "smollm2-draft"  # the distilled 14M draft for weak devices


def _of(section: str, default: Any) -> Any:
    """A field that only section `section` reads."""
    return dataclasses.field(default=default, metadata={"section": section})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    gamma: int = 4  # the speculation length every section uses (swept in `colocated`)
    prompt_len: int = 32
    repeats: int = 5  # timed repeats per measurement (the best counts), after a warm-up
    # 1. co-located speculative vs plain (batch 1, one prompt at a time)
    prompts: int = 4
    new_tokens: int = 128
    gammas: tuple[int, ...] = (2, 4, 6)
    modes: tuple[str, ...] = ("sync", "pipelined")
    temperatures: tuple[float, ...] = (0.0, 1.0)
    self_modes: tuple[str, ...] = ("sync", "pipelined")  # self-speculation: gamma only
    # 2. peer (HF transformers, greedy, batch 1)
    peer_prompts: int = 4
    peer_new_tokens: int = 128
    # 3. capacity: bisection on the number of clients (`capacity.bisect_capacity`)
    capacity_start: int = 4  # the first N tried; N doubles (halves) from there
    capacity_max_clients: int = 128  # at most this many (a capacity above it is censored)
    capacity_precision: float = 0.125  # bisection stops at a bracket within 12.5% of N
    capacity_new_tokens: int = 64
    client_rate: float = 100.0  # tokens/s every client must get
    # 4. RTT sweep and batch sweep
    rtts_ms: tuple[int, ...] = (0, 5, 20, 50, 100, 200)
    latency_new_tokens: int = 64
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    batch_steps: int = 10
    roofline_mib: int = 256
    roofline_n: int = 2048
    # 5. wire cost (sampled sessions, one per encoding)
    wire_prompts: int = 8
    wire_new_tokens: int = 64
    wire_sparse_ks: tuple[int, ...] = (4, 16)
    # W4A16 quality
    quality_windows: int = 32
    quality_seq_len: int = 256
    quality_prompts: int = 8
    quality_new_tokens: int = 48
    # The real pair (`jaxspec_apps.bench.real`): Spec-Bench per category, and which profile
    # sizes its pass (None: this profile's own).
    specbench_per_category: int = 3
    specbench_new_tokens: int = 128
    real_prompt_tokens: int | None = None  # cut prompts to this many tokens (tiny models)
    real_profile: bool = False  # the real pair's pass uses `REAL`'s sizes, else these
    default_pairs: str = "tiny"  # what `--pairs` defaults to: tiny, real or both
    # Sections run only when named. adaptive: gamma="auto" against every fixed gamma
    adaptive_rtts_ms: tuple[float, ...] = _of("adaptive", (0.0, 20.0, 50.0, 100.0, 200.0))
    adaptive_longest: int = _of("adaptive", 8)
    adaptive_prompts: int = _of("adaptive", 2)
    adaptive_new_tokens: int = _of("adaptive", 48)
    adaptive_drafts: tuple[str, ...] = _of("adaptive", ("self", "draft"))  # which pairs
    # fleet: verifier replicas (subprocesses), closed-loop clients, a SIGKILL
    fleet_sessions: int = _of("fleet", 8)
    fleet_seconds: float = _of("fleet", 30.0)
    fleet_new_tokens: int = _of("fleet", 64)
    # openai: the OpenAI-compatible endpoint against edge sessions
    openai_new_tokens: int = _of("openai", 64)
    openai_clients: int = _of("openai", 8)
    openai_repeats: int = _of("openai", 7)
    # target (real pair): plain greedy, jaxspec vs transformers, against the roofline
    target_new_tokens: int = _of("target", 128)
    target_repeats: int = _of("target", 3)
    target_prompts: int = _of("target", 4)
    # int4 (real pair's shapes): the int4 kernel against XLA's paths
    int4_rows: tuple[int, ...] = _of("int4", (1, 5, 16))
    int4_group: int = _of("int4", 64)
    int4_offset: bool = _of("int4", False)
    int4_repeats: int = _of("int4", 7)
    # two_process: the verifier and the edge as two pinned processes over gRPC
    # round_profile: where a round's time goes, per mode (cProfile)
    round_profile_new_tokens: int = _of("round_profile", 64)
    program_turns: int = _of("round_profile", 9)  # program_vs_parts: turns, best kept
    program_rows: tuple[int, ...] = _of("round_profile", (1, 2, 4))  # verify step rows
    stall_rtt_ms: float = _of("round_profile", 50.0)  # the pipelined edge behind a link
    two_process_rtts_ms: tuple[float, ...] = _of("two_process", (0.0, 20.0, 50.0, 100.0))
    two_process_new_tokens: int = _of("two_process", 64)
    two_process_repeats: int = _of("two_process", 2)
    two_process_max_len: int = _of("two_process", 512)
    two_process_chat: str = _of(
        "two_process", "Write a Python function that returns the n-th Fibonacci number."
    )


PROFILES = {
    "full": Profile(name="full", real_profile=True, default_pairs="both"),
    "quick": Profile(
        name="quick",
        repeats=1,
        prompts=1,
        new_tokens=16,
        gammas=(4,),
        modes=("sync",),
        self_modes=("sync",),
        peer_prompts=1,
        peer_new_tokens=16,
        capacity_start=8,
        capacity_max_clients=32,
        capacity_precision=0.5,
        capacity_new_tokens=12,
        rtts_ms=(0, 50),
        latency_new_tokens=12,
        batches=(1, 32),
        batch_steps=2,
        roofline_mib=32,
        roofline_n=512,
        wire_prompts=1,
        wire_new_tokens=8,
        quality_windows=2,
        quality_seq_len=64,
        quality_prompts=2,
        quality_new_tokens=8,
        specbench_per_category=1,
        specbench_new_tokens=16,
        adaptive_rtts_ms=(0.0, 50.0),
        adaptive_longest=4,
        adaptive_prompts=1,
        adaptive_new_tokens=16,
        fleet_sessions=2,
        fleet_seconds=2.0,
        fleet_new_tokens=16,
        openai_new_tokens=16,
        openai_clients=2,
        openai_repeats=1,
        target_new_tokens=16,
        target_repeats=1,
        target_prompts=1,
        int4_rows=(1,),
        int4_repeats=1,
        two_process_rtts_ms=(0.0, 50.0),
        two_process_new_tokens=8,
        two_process_repeats=1,
        two_process_max_len=128,
        round_profile_new_tokens=8,
        program_turns=1,
        program_rows=(1, 2),
    ),
}
PROFILES["tiny"] = dataclasses.replace(
    PROFILES["quick"],
    name="tiny",
    prompt_len=8,
    temperatures=(0.0,),
    # One length and one batch size wherever possible: sections then share compilations.
    new_tokens=8,
    peer_new_tokens=8,
    capacity_new_tokens=8,
    latency_new_tokens=8,
    quality_new_tokens=8,
    quality_prompts=1,
    specbench_new_tokens=8,
    real_prompt_tokens=24,  # one prompt length: every prompt shares the compilations
    capacity_start=1,  # one probe per mode: bisect_capacity is unit-tested; the machinery runs
    capacity_max_clients=1,
    roofline_mib=8,
    roofline_n=256,
    wire_new_tokens=6,
    quality_seq_len=32,
    adaptive_rtts_ms=(0.0, 20.0),
    adaptive_longest=2,
    adaptive_new_tokens=8,
    adaptive_drafts=("self",),
    target_new_tokens=10,
)

# A 135M target on 2 cores: one prompt per category where the tiny pair takes four, no
# sweep of gamma or mode (Spec-Bench's T = 0 table is the headline), fewer clients.
REAL = Profile(
    name="real",
    repeats=1,
    prompts=5,
    new_tokens=128,
    gammas=(4,),
    modes=("sync",),
    self_modes=(),
    peer_prompts=3,
    peer_new_tokens=128,
    capacity_start=4,
    capacity_max_clients=64,
    capacity_precision=0.25,
    capacity_new_tokens=32,
    client_rate=10.0,
    rtts_ms=(0, 20, 50, 100),
    latency_new_tokens=32,
    batches=(1, 4, 16),
    batch_steps=4,
    wire_prompts=2,
    wire_new_tokens=32,
    quality_windows=8,
    quality_seq_len=256,
    quality_prompts=4,
    quality_new_tokens=48,
)


def real_sizes(p: Profile) -> Profile:
    """The sizes of the real pair's pass in a run of profile `p`."""
    return REAL if p.real_profile else p


def suite_settings(p: Profile) -> dict[str, Any]:
    """`p`'s fields that the suite's sections read (`results["profile_settings"]`)."""
    return {
        f.name: getattr(p, f.name) for f in dataclasses.fields(p) if "section" not in f.metadata
    }


def with_settings(p: Profile, items: Sequence[str]) -> Profile:
    """`p` with `NAME=VALUE` items (`--set`) in place of its fields: numbers as numbers,
    tuples comma-separated, booleans true/false, `none` for an optional value."""
    hints = typing.get_type_hints(Profile)
    changes = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in hints or name == "name":
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME a field of "
                             f"the profile ({', '.join(sorted(hints))})")  # fmt: skip
        try:
            changes[name] = _parse(hints[name], value.strip())
        except ValueError as e:
            raise ValueError(f"--set {item!r}: {e}") from None
    return dataclasses.replace(p, **changes)


def _parse(kind: Any, value: str) -> Any:
    """`value` as type `kind` (a `Profile` field's)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        return tuple(_parse(args[0], v.strip()) for v in value.split(",") if v.strip())
    if type(None) in args:  # X | None
        return None if value.lower() == "none" else _parse(args[0], value)
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{value!r} is not true or false")
        return value.lower() in ("true", "1", "yes")
    return kind(value)
