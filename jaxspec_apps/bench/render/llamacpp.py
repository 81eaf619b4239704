"""The `llamacpp` section's part of the report (from its results alone)."""

from __future__ import annotations

from typing import Any

from jaxspec_apps.bench.llamacpp import TG, VERSION
from jaxspec_apps.bench.render.tables import Page


def markdown(r: dict[str, Any], page: Page) -> list[str]:
    b, t, them = r["theirs"]["bench"], r["ours"]["tok_s"], r["theirs"]
    tg = f"tg{TG}"
    rows = [
        ("float32 decode, 2 threads", t["F32/t2"], b["F32"][f"{tg}/t2"], "F32"),
        ("float32 decode, 1 thread", t["F32/t1"], b["F32"][f"{tg}/t1"], "F32"),
        ("bfloat16 decode, 2 threads", t["BF16/t2"], b["BF16"][f"{tg}/t2"], "BF16"),
        *([("bfloat16 decode, 1 thread", t["BF16/t1"], b["BF16"][f"{tg}/t1"], "BF16")]
          if "BF16/t1" in t else []),
        ("int4 decode, 2 threads (theirs Q4_1)", t["W4A16/t2"], b["Q4_1"][f"{tg}/t2"], "Q4_1"),
        ("int4 decode, 1 thread (theirs Q4_1)", t["W4A16/t1"], b["Q4_1"][f"{tg}/t1"], "Q4_1"),
        ("int4 decode, 2 threads (theirs Q4_0)", t["W4A16/t2"], b["Q4_0"][f"{tg}/t2"], "Q4_0"),
        ("speculative, F32 target + int4 draft, γ 4, T 0", r["ours"]["speculative_tok_s"],
         them["speculative"]["tok_s"], "F32 + Q4_1"),
    ]  # fmt: skip
    build = them["build"]
    how = "cached" if build.get("cached") else "built in this run"
    lines = [
        "",
        "### llama.cpp beside us on the same GGUF",
        "",
        f"llama.cpp (llama-cpp-python {VERSION}'s vendored tree, {how}; the build took "
        f"{build['build_s']:.0f} s) beside jaxspec on the same GGUF and the same cores, in one "
        "run. Tokens/s; the ratio is ours / theirs.",
        "",
        "| part | jaxspec | llama.cpp | ours / theirs | their weights |",
        "|---|---:|---:|---:|---|",
        *[f"| {n} | {o:.1f} | {w:.1f} | **{o / w:.2f}** | {f} |" for n, o, w, f in rows],
        "",
        f"5-token forward / 1-token: ours {r['ours']['forward5_over_1']:.2f} (float32); "
        "theirs "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["their_forward5_over_1"].items())
        + f". Their speculative decoding accepted {them['speculative']['accepted']} of "
        f"{them['speculative']['drafted']} drafts. Our float32 decode reads "
        f"{r['ours']['f32_bytes_per_token'] / 2**20:.0f} MiB per token: "
        f"**{r['decode_bandwidth_fraction']:.0%}** of the {r['bandwidth_Bps'] / 1e9:.1f} GB/s "
        f"read bandwidth probed in this run ({r['bandwidth_probe']})"
        + (
            f"; our bfloat16 decode {r['ours']['bf16_bytes_per_token'] / 2**20:.0f} MiB: "
            f"**{r['decode_bandwidth_fraction_bf16']:.0%}**. A W4A16 token costs "
            f"**{r['w4a16_over_f32']:.2f}** of a float32 token (2 threads)."
            if "decode_bandwidth_fraction_bf16" in r
            else "."
        ),
    ]
    return lines
