"""Wire cost of the draft encodings: bytes per committed token on the gRPC path, next to alpha.

Real edge sessions (`edge.run_session`, `edge.Drafter`) run against a `verify.LocalVerifier`
wrapped in `CountingEndpoint`, which converts every message exactly as the gRPC client and
server do (`jaxspec.protocol.wire.block_to_proto` / `result_to_proto`) and adds up their serialized
sizes (`ByteSize()`, the protobuf payload; gRPC/HTTP2 framing and TLS add a few bytes per
message on top). Session open/close are one-off and not counted. The encodings trade bytes
for acceptance: `full` sends q over the whole vocabulary, `sparse` k (id, prob) pairs per
draft (the edge samples from its renormalized top-k), `onehot` token ids only (greedy
drafts, q = delta). The `-f16` rows send the q of `full` / `sparse` as float16 values with
one scale per draft (`DraftSpec.q_dtype`): half the bytes of q, and the edge samples from
that rounded q, so the verification stays exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from edge.drafter import Drafter
from edge.session import run_session
from jaxspec.figures import AcceptanceFigures
from jaxspec.protocol import DraftSpec, SamplingSettings, SessionConfig, wire
from jaxspec_apps.bench.section import Context, Section, sizes
from verify import LocalVerifier

# This section's sizes (sampled sessions, one per encoding).
Config = sizes("wire_", prompts=8, new_tokens=64, sparse_ks=(4, 16))


QUICK_SIZES = Config(prompts=1, new_tokens=8)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=6)
REAL_SIZES = Config(prompts=2, new_tokens=32)


class CountingEndpoint:
    """A `VerifierEndpoint` that forwards to `inner` and counts the protobuf bytes of every
    block sent up and every result sent down."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.up_bytes = self.down_bytes = self.blocks = 0

    async def open_session(self, config: Any) -> Any:
        return await self.inner.open_session(config)

    async def verify(self, block: Any) -> Any:
        self.up_bytes += wire.block_to_proto(block).ByteSize()
        self.blocks += 1
        result = await self.inner.verify(block)
        self.down_bytes += wire.result_to_proto(result).ByteSize()
        return result

    async def close_session(self, session_id: str) -> None:
        await self.inner.close_session(session_id)


def encodings(
    gamma: int, sparse_ks: Sequence[int], f16: bool = True
) -> list[tuple[str, DraftSpec]]:
    """(label, draft spec) for full, sparse at each k, and onehot, all `gamma` drafts a block;
    with `f16`, also full and each sparse k with q sent as float16 (`full-f16`, `sparse4-f16`:
    `DraftSpec.q_dtype`)."""
    specs = [
        ("full", DraftSpec(gamma=gamma, encoding="full")),
        *((f"sparse{k}", DraftSpec(gamma=gamma, encoding="sparse", sparse_k=k)) for k in sparse_ks),
    ]
    if f16:
        specs += [(f"{label}-f16", replace(s, q_dtype="float16")) for label, s in specs]
    return [*specs, ("onehot", DraftSpec(gamma=gamma, encoding="onehot"))]


async def _session(
    sched: Any, draft: Any, prompt: Sequence[int], config: dict[str, Any]
) -> dict[str, Any]:
    """One sync session through `CountingEndpoint`: its tokens, the bytes each way, the
    blocks sent, and the verifier's acceptance figures."""
    cfg = SessionConfig(prompt=tuple(int(t) for t in prompt), **config)
    verifier = LocalVerifier(scheduler=sched)
    ep = CountingEndpoint(verifier)
    drafter = Drafter(draft, cfg.draft)
    try:
        tr = await run_session(ep, drafter, cfg, depth=1)
    finally:
        await verifier.aclose()
    return {
        "tokens": len(tr.tokens),
        "figures": tr.figures,
        "up_bytes": ep.up_bytes,
        "down_bytes": ep.down_bytes,
        "blocks": ep.blocks,
    }


def run(
    draft: Any,
    prompts: Sequence[Sequence[int]],
    sched: Any,
    *,
    gamma: int,
    new_tokens: int,
    sparse_ks: Sequence[int],
    temperature: float = 1.0,
    f16: bool = True,
) -> list[dict[str, Any]]:
    """One row per encoding: bytes up/down per committed token and alpha, over one sampled
    sync session per prompt (same seeds for every encoding); `f16` adds the float16 q rows
    (`encodings`)."""
    rows = []
    for label, spec in encodings(gamma, sparse_ks, f16):
        config = dict(
            max_new_tokens=new_tokens, mode="sync", draft=spec,
            sampling=SamplingSettings(temperature=temperature), stop_tokens=(),
        )  # fmt: skip
        runs = [
            asyncio.run(_session(sched, draft, p, config | {"seed": i}))
            for i, p in enumerate(prompts)
        ]
        counted = ("tokens", "up_bytes", "down_bytes", "blocks")
        tot = {key: sum(r[key] for r in runs) for key in counted}
        figures = sum((r["figures"] for r in runs), AcceptanceFigures())
        rows.append(
            {
                "encoding": label,
                "sparse_k": spec.k or None,
                "q_dtype": spec.q_dtype if spec.encoding != "onehot" else None,
                "temperature": temperature,
                "sessions": len(runs),
                "tokens": tot["tokens"],
                "bytes_up_per_token": tot["up_bytes"] / tot["tokens"],
                "bytes_down_per_token": tot["down_bytes"] / tot["tokens"],
                "bytes_per_token": (tot["up_bytes"] + tot["down_bytes"]) / tot["tokens"],
                "bytes_per_block_up": tot["up_bytes"] / tot["blocks"],
                "alpha": figures.acceptance_rate,
                "tokens_per_round": figures.tokens_per_round,
            }
        )
    return rows


def run_section(ctx: Context) -> dict[str, Any]:
    """Every encoding over the pass's first `wire_prompts` prompts on the shared verifier."""
    p = ctx.p
    rows = run(
        ctx.draft, ctx.prompts[: p.wirecost.prompts], ctx.sched(), gamma=p.gamma,
        new_tokens=p.wirecost.new_tokens, sparse_ks=p.wirecost.sparse_ks,
    )  # fmt: skip
    return {"gamma": p.gamma, "new_tokens": p.wirecost.new_tokens, "rows": rows}


SECTION = Section("wirecost", run_section)
