"""Co-located decoding with a deliberately wrong variant (`jaxspec.decoding.verification.Variant`):
the mutants reach the jitted code through `jaxspec.decoding.generate.decode`, the layer below the
public `generate`, never through its keywords."""

from __future__ import annotations

from jaxspec.decoding.generate import decode
from jaxspec.decoding.sampling import SamplingParams, session_keys
from jaxspec.decoding.verification import Variant
from jaxspec.nn.model import Model
from jaxspec.protocol import DraftSpec


def mutated(
    target: Model,
    draft: Model,
    prompt: list[int],
    rows: int,
    new_tokens: int,
    mutant: str,
    *,
    mode: str = "sync",
    gamma: int = 2,
    encoding: str = "full",
    **sampling,
):
    """`[rows, new_tokens]` tokens (-1 padded) and the stats of `rows` copies of `prompt`
    decoded speculatively under `mutant`, seed 0 (what `jaxspec.generate` would give with
    the same keywords, were the rule right)."""
    params = SamplingParams.make(rows, **sampling, vocab_size=target.config.vocab_size)
    return decode(
        target, [list(prompt)] * rows, new_tokens, params, session_keys(0, rows),
        target.config.eos_token_ids, draft=draft, spec=DraftSpec(gamma=gamma, encoding=encoding),
        mode=mode, max_batch=rows, variant=Variant(mutant),
    )  # fmt: skip
