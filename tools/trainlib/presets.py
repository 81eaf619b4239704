"""The default pair's presets: the two architectures (the core's `LlamaConfig`, tied
embeddings) and the training sizes, schedule and time budget; `TINY` runs every step in
seconds (CI)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.nn.config import LlamaConfig


def llama(vocab: int, context: int, hidden: int, mlp: int, layers: int, heads: int) -> LlamaConfig:
    """A tied-embedding Llama with half as many KV heads as query heads; the tokenizer's
    BOS/EOS come in with `make_config`."""
    return LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        head_dim=hidden // heads, max_position_embeddings=context, tie_word_embeddings=True,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one training run does: the models, the batches, the schedule and the budgets."""

    name: str
    target: LlamaConfig
    draft: LlamaConfig
    batch: int
    seq_len: int
    warmup_steps: int
    lr_target: float
    lr_draft: float
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    distill_alpha_ce: float = 0.1
    eval_batch: int = 16
    eval_windows: int = 256  # windows of seq_len+1 tokens per held-out kind (source, docs)
    long_eval_windows: int = 32  # windows of max_position_embeddings tokens (0: skip)
    max_train_bytes: int | None = None
    max_eval_bytes: int | None = None
    target_steps: int | None = None  # fixed step counts (None: planned from --minutes)
    draft_steps: int | None = None
    # Share of the training time (after corpus and tokenizer, less an eval reserve).
    target_share: float = 0.62
    eval_reserve_s: float = 150.0
    log_every: int = 10
    checkpoint_every_s: float = 120.0

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary, which both models share."""
        return self.target.vocab_size

    @property
    def max_position_embeddings(self) -> int:
        """The longest context both models are built for."""
        return self.target.max_position_embeddings


FULL = Preset(
    "full", llama(4096, 512, 256, 688, 6, 8), llama(4096, 512, 128, 344, 2, 4),
    batch=16, seq_len=256, warmup_steps=30, lr_target=2e-3, lr_draft=3e-3,
)  # fmt: skip

TINY = Preset(
    "tiny", llama(384, 128, 64, 172, 2, 4), llama(384, 128, 32, 86, 1, 2),
    batch=4, seq_len=64, warmup_steps=2, lr_target=3e-3, lr_draft=3e-3, eval_batch=4,
    eval_windows=6, long_eval_windows=0, max_train_bytes=150_000, max_eval_bytes=30_000,
    target_steps=6, draft_steps=4, eval_reserve_s=0.0, log_every=2, checkpoint_every_s=1e9,
)  # fmt: skip


def make_config(arch: LlamaConfig, tokenizer: Any) -> LlamaConfig:
    """`arch` with the tokenizer's BOS and EOS."""
    return dataclasses.replace(
        arch, bos_token_id=tokenizer.bos_token_id, eos_token_ids=(tokenizer.eos_token_id,)
    )
