"""Co-located speculative vs plain decoding: tokens/s ratio, alpha and tokens per round.

Both decoders run on the same prompts in one process, each warmed up (compiled) before it
is timed; greedy outputs must be identical (the benchmark refuses to report a lossy speedup).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jaxspec
from jaxspec_apps.bench.common import best_time, check_same_tokens


def _timed_generate(
    target: Any,
    prompts: Sequence[Sequence[int]],
    batch: int,
    new_tokens: int,
    repeats: int,
    **kw: Any,
) -> tuple[float, int, list[list[int]], list[Any]]:
    """(seconds, new tokens, token lists, stats) of `generate` over `prompts` in chunks of
    `batch` rows; each chunk's time is the best of `repeats` after a warm-up."""

    seconds, tokens, outs, stats = 0.0, 0, [], []
    for lo in range(0, len(prompts), batch):
        chunk = [list(p) for p in prompts[lo : lo + batch]]
        t, out = best_time(lambda c=chunk: jaxspec.generate(target, c, new_tokens, **kw), repeats)
        seconds += t
        tokens += out.stats.new_tokens
        outs += out.tokens
        stats.append(out.stats)
    return seconds, tokens, outs, stats


def _pooled(stats: list[Any]) -> dict[str, Any]:
    """Alpha, tokens per round and per-position acceptance over several `generate` calls,
    pooled by their counters (vLLM's definitions, `jaxspec.speculative.SpecStats`)."""
    spec = [s.spec for s in stats]
    drafted, rounds = sum(s.drafted for s in spec), sum(s.rounds for s in spec)
    per_pos = [sum(c) for c in zip(*(s.per_position_accepted for s in spec), strict=True)]
    return {
        "alpha": sum(s.accepted for s in spec) / drafted if drafted else 0.0,
        "tokens_per_round": sum(s.emitted for s in spec) / rounds if rounds else 0.0,
        "per_position_acceptance": [a / rounds if rounds else 0.0 for a in per_pos],
    }


def run(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    *,
    gammas: Sequence[int],
    temperatures: Sequence[float],
    new_tokens: int,
    repeats: int,
    modes: Sequence[str] = ("sync", "pipelined"),
    batch: int = 1,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (temperature, gamma, mode): plain and speculative tokens/s, their ratio,
    alpha (accepted / drafted) and tokens per round, over all `prompts`."""
    rows = []
    common = dict(seed=seed, stop_tokens=())
    for temp in temperatures:
        t_plain, n_plain, plain_out, _ = _timed_generate(
            target, prompts, batch, new_tokens, repeats, temperature=temp, **common
        )
        for gamma in gammas:
            for mode in modes:
                t_spec, n_spec, spec_out, stats = _timed_generate(
                    target, prompts, batch, new_tokens, repeats, temperature=temp,
                    draft=draft, gamma=gamma, mode=mode, **common,
                )  # fmt: skip
                if temp == 0.0:
                    for i, (got, want) in enumerate(zip(spec_out, plain_out, strict=True)):
                        check_same_tokens(
                            f"speculative gamma={gamma} {mode}, prompt {i}", got, want
                        )
                rows.append(
                    {
                        "temperature": temp,
                        "gamma": gamma,
                        "mode": mode,
                        "batch": batch,
                        "prompts": len(prompts),
                        "plain_tok_s": n_plain / t_plain,
                        "spec_tok_s": n_spec / t_spec,
                        "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                        **_pooled(stats),
                    }
                )
    return rows
