"""Benchmark sizes (stdlib only). `full` is the committed report; `quick` keeps CI honest in
under two minutes; `tiny` is for tests with tiny random checkpoints."""

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
    # 3. capacity
    capacity_ns: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
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


PROFILES = {
    "full": Profile(name="full"),
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
        capacity_ns=(1, 32),
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
    capacity_ns=(1,),  # one point: capacity_at is unit-tested; the machinery runs
    roofline_mib=8,
    roofline_n=256,
    wire_new_tokens=6,
    quality_seq_len=32,
)
