"""The `cost` section (real pair): each model's time per token of plain greedy decoding
against its roofline, and the draft's share of the target's (the cost ratio c of the papers'
speedup model). Beside the pair, the target in bfloat16 and each int4 draft on XLA's path
(unpack + dot) next to the int4 kernel's, and the small distilled draft.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jaxspec
from jaxspec.compilation.shapes import bucket
from jaxspec.quant.layers import quant_spec, with_kernel
from jaxspec_apps.bench.common import SELF_DRAFT, SMALL_DRAFT, best_time
from jaxspec_apps.bench.section import Context, Section
from jaxspec_apps.bench.verifier import kv_bytes

SHORT = 8  # the call whose time is subtracted: prefill + the first SHORT tokens


def loop_s_per_token(decode: Callable[[int], Any], new: int, repeats: int) -> float:
    """Seconds per token of a decoding loop alone: (t(new) - t(SHORT)) / (new - SHORT), with
    t(n) the best of `repeats` calls `decode(n)` after a warm-up, so the prefill and dispatch
    cancel out. A loop too fast to difference on a busy machine: the whole call's time."""
    long, _ = best_time(lambda: decode(new), repeats)
    short, _ = best_time(lambda: decode(SHORT), repeats)
    if long <= short:
        return long / new
    return (long - short) / (new - SHORT)


def plain_greedy(model: Any, prompt: Sequence[int]) -> Callable[[int], Any]:
    """n -> plain greedy decoding of `prompt` to `n` new tokens, no stop token (the
    `jaxspec.generate` result)."""
    return lambda n: jaxspec.generate(model, list(prompt), n, temperature=0.0, stop_tokens=())


def decode_s_per_token(model: Any, prompt: list[int], new: int, repeats: int) -> float:
    """Seconds per token of plain greedy decoding's loop alone (`loop_s_per_token`)."""
    return loop_s_per_token(plain_greedy(model, prompt), new, repeats)


def cost_variants(target: Any, draft: Any, small: Any | None) -> dict[str, Any]:
    """The models whose decode cost the cost section compares with the pair's: the target in
    bfloat16, and each int4 draft on XLA's path (unpack + dot) next to the int4 kernel's."""
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), target.params)
    out = {"target bf16": target.with_params(bf16, dtype=jnp.bfloat16)}
    for name, m in (("draft", draft), ("small draft", small)):
        if m is not None and quant_spec(m) is not None and quant_spec(m).tiled:
            out[f"{name} (XLA int4 path)"] = with_kernel(m, False)
    if small is not None:
        out["small draft"] = small
    return out


def cost(
    target: Any, draft: Any, prompt: list[int], new: int, repeats: int, roof: dict[str, float],
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Time per token of each model's plain decode loop, the draft's share of the target's
    (`draft_cost_ratio`) and each against its roofline: weight bytes plus the KV bytes one
    step reads (the whole slot, as the jitted step attends over it) ÷ read bandwidth.
    `extras` (name -> model) are timed the same way, for comparison."""
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "new_tokens": new}
    slot = bucket(len(prompt) + new, 64)  # `generate`'s cache length
    for name, m in (("target", target), ("draft", draft), *(extras or {}).items()):
        s = decode_s_per_token(m, prompt, new, repeats)
        kv = kv_bytes(m, 1, slot)
        floor = (m.nbytes() + kv) / roof["bandwidth_Bps"]
        out[name] = {
            "s_per_token": s,
            "tok_s": 1 / s,
            "weight_bytes": m.nbytes(),
            "kv_bytes_per_step": kv,
            "roofline_s": floor,
            "roofline_fraction": floor / s,
        }
    out["draft_cost_ratio"] = out["draft"]["s_per_token"] / out["target"]["s_per_token"]
    return out


def run_section(ctx: Context) -> dict[str, Any]:
    """The pair on its first prompt, and (for the default pair) the comparison rows."""
    p, target, draft = ctx.p, ctx.target, ctx.draft
    # the comparison rows (bf16 target, XLA's int4 path, the small draft): the real pair's
    extras = cost_variants(target, draft, jaxspec.load(SMALL_DRAFT)) if (
        ctx.draft_name == SELF_DRAFT) else {}  # fmt: skip
    n, reps = max(p.colocated.new_tokens, 40), max(p.repeats, 3)
    return cost(target, draft, ctx.prompts[0], n, reps, ctx.roof(), extras)


SECTION = Section("cost", run_section)
