"""`train_report.json`'s parts: the corpus and tokenizer, the training recipe, and each
model's config, sizes and phase summary."""

from __future__ import annotations

import dataclasses
import pathlib
import sysconfig
from typing import Any

import numpy as np

from trainlib.corpus import BOS, EOS, HELDOUT_PER_10000, SKIP_DIRS, Doc
from trainlib.presets import Preset


@dataclasses.dataclass
class Data:
    """The corpus split, the tokenizer and the token streams."""

    train_docs: list[Doc]
    held_docs: list[Doc]
    tokenizer: Any
    train_stream: np.ndarray
    held_streams: dict[str, np.ndarray]
    train_bytes: int
    held_bytes: int


@dataclasses.dataclass
class Trained:
    """The configs and what the training phases returned."""

    tcfg: Any
    dcfg: Any
    target_params: Any
    t_meta: dict[str, Any]
    d_arrays: dict[str, Any]
    d_meta: dict[str, Any]


def dir_bytes(d: pathlib.Path) -> int:
    """The bytes of the files under `d`."""
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def phase_summary(meta: dict[str, Any], member: str, peak: float, preset: Preset) -> dict[str, Any]:
    """A model's steps, times, schedule and losses, from its phase's `meta`."""
    hist = meta["history"][member]
    times = meta["step_times"]
    tail = hist[-min(10, len(hist)) :]
    out = {
        "steps": meta["step"],
        "planned_steps": meta["total"],
        "stopped_early": meta["stopped_early"],
        "tokens_seen": meta["step"] * preset.batch * preset.seq_len,
        "phase_time_s": meta["elapsed_s"],
        "step_time_s": float(np.mean(times[1:] or times)),
        "peak_lr": peak,
        "warmup_steps": preset.warmup_steps,
        "final_train_loss": float(np.mean([h["loss"] for h in tail])),
        "loss_history": [h["loss"] for h in hist],
    }
    if "kl" in hist[0]:
        out["final_train_kl"] = float(np.mean([h["kl"] for h in tail]))
        out["final_train_ce"] = float(np.mean([h["ce"] for h in tail]))
        out["kl_history"] = [h["kl"] for h in hist]
    return out


def corpus_report(data: Data) -> dict[str, Any]:
    """How the corpus was made and split, with the held-out documents' names."""
    return {
        "stdlib_dir": sysconfig.get_paths()["stdlib"],
        "rule": (
            "non-test .py files of the stdlib (skipping dirs "
            f"{sorted(SKIP_DIRS)}, test_*.py, gencodec charmap tables, "
            "pydoc_data/topics.py) + pydoc_data.topics.topics; a whole document is "
            f"held out iff int(sha256(name)[:8], 16) % 10000 < {HELDOUT_PER_10000}"
        ),
        "train_documents": len(data.train_docs),
        "heldout_documents": len(data.held_docs),
        "train_bytes": data.train_bytes,
        "heldout_bytes": data.held_bytes,
        "train_tokens": len(data.train_stream),
        "heldout_tokens": {k: len(v) for k, v in data.held_streams.items()},
        "heldout_names": [d.name for d in data.held_docs],
    }


def tokenizer_report(data: Data) -> dict[str, Any]:
    """The tokenizer's kind, vocabulary and special tokens."""
    return {
        "type": "byte-level BPE (tokenizers), PreTrainedTokenizerFast",
        "vocab_size": len(data.tokenizer),
        "bos_token": BOS,
        "eos_token": EOS,
        "train_bytes_per_token": data.train_bytes / max(1, len(data.train_stream)),
    }


def training_report(preset: Preset) -> dict[str, Any]:
    """The batches, the optimizer and the distillation loss."""
    return {
        "batch": preset.batch,
        "seq_len": preset.seq_len,
        "optimizer": (
            f"AdamW(b1=0.9, b2=0.95, wd={preset.weight_decay} on matrices), clip "
            f"{preset.clip_norm}, linear warmup {preset.warmup_steps} steps, cosine to "
            f"{preset.min_lr_ratio}×peak, float32"
        ),
        "distill_loss": (
            f"{1 - preset.distill_alpha_ce:g}*KL(target||draft) + "
            f"{preset.distill_alpha_ce:g}*CE, teacher logits on the fly"
        ),
    }


def models_report(
    preset: Preset, trained: Trained, sizes: dict[str, int], target: Any, draft: Any
) -> dict[str, Any]:
    """The report's "target", "draft" and "draft_data_only" entries."""
    tcfg, dcfg = trained.tcfg, trained.dcfg
    t_meta, d_meta = trained.t_meta, trained.d_meta
    return {
        "target": {
            "config": tcfg.to_hf(),
            "num_params": tcfg.num_params,
            "bytes": sizes["target"],
            "weights_bytes": 2 * target.num_params(),
            **phase_summary(t_meta, "target", preset.lr_target, preset),
        },
        "draft": {
            "config": dcfg.to_hf(),
            "num_params": dcfg.num_params,
            "bytes": sizes["draft"],
            "weights_bytes": 2 * draft.num_params(),
            "distilled_from": "target",
            **phase_summary(d_meta, "draft", preset.lr_draft, preset),
        },
        "draft_data_only": {
            "config": dcfg.to_hf(),
            "num_params": dcfg.num_params,
            "shipped": False,
            **phase_summary(d_meta, "draft_data_only", preset.lr_draft, preset),
        },
    }
