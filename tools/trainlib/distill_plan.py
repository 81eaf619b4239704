"""What one run of `tools/distill_smollm2.py` does: prompt counts, sequence sizes, the
draft's shape and its training; `TINY` is every step at a size that runs in a minute or two."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sizes of one distillation run."""

    prompts_per_category: int = 120
    """training prompts of each category (at most)"""
    heldout_per_category: int = 12
    """held-out prompts of each category (the report's and the benchmarks')"""
    answer_tokens: int = 128
    """new tokens of each of the target's answers"""
    answer_batch: int = 48
    """prompts the target answers in one `jaxspec.generate` call"""
    plain_windows: int = 150
    """windows of ordinary text (pydoc topics, stdlib sources) besides the chats"""
    seq_len: int = 320
    """the longest training sequence, in input tokens"""
    top_k: int = 32
    """teacher log-probabilities kept per position"""
    width: int = 256
    """the draft's hidden size"""
    layers: int = 2
    """the draft's layers"""
    steps: int = 300
    """optimizer steps"""
    batch: int = 12
    """sequences of `seq_len` per step (shorter buckets take more, for the same tokens)"""
    lr: float = 2e-3
    """the peak learning rate"""
    warmup: int = 30
    """linear warmup steps before the cosine decay"""
    eval_tokens: int = 96
    """new tokens per held-out prompt when alpha is measured"""
    table: str = "int4"
    """the embedding/head table as shipped: "int4" or "bf16\""""


TINY = Plan(
    prompts_per_category=3, heldout_per_category=2, answer_tokens=16, answer_batch=8,
    plain_windows=4, seq_len=64, top_k=8, width=64, layers=1, steps=6, batch=4, warmup=2,
    eval_tokens=12,
)  # fmt: skip
