"""Benchmark sizes (stdlib only). `full` is the committed report: the shipped tiny pair at
these sizes, then the real pair (SmolLM2 and its W4A16 draft) at the `real` sizes; `quick`
keeps CI honest in under two minutes; `tiny` is for tests with tiny random checkpoints."""

from __future__ import annotations

import dataclasses

SECTIONS = ("colocated", "peer", "capacity", "latency", "verifier", "wirecost", "quality")


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
