"""What every section shares: timing, held-out prompts, the greedy-equality check, the machine,
its roofline and a warmed-up verifier."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pydoc_data.topics import topics
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import kernels
from verify import Scheduler, SchedulerConfig

SELF_DRAFT = "smollm2-w4a16"  # the real pair's draft: SmolLM2's own W4A16 copy
SMALL_DRAFT = "smollm2-draft"  # the distilled 14M draft for weak devices
TRAIN_REPORT = pathlib.Path(__file__).resolve().parents[1] / "models" / "train_report.json"


class GreedyMismatch(AssertionError):
    """Two decoders that must agree token for token (greedy, same checkpoint) did not."""


def check_same_tokens(label: str, got: Sequence[int], want: Sequence[int]) -> None:
    """Raise `GreedyMismatch` naming the first position where `got` and `want` differ."""
    got, want = [int(t) for t in got], [int(t) for t in want]
    if got == want:
        return
    i = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    i = min(len(got), len(want)) if i is None else i
    raise GreedyMismatch(
        f"{label}: greedy tokens differ at new token {i} (lengths {len(got)} vs {len(want)}): "
        f"{got[i : i + 5]} vs {want[i : i + 5]}"
    )


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_roofline(mib: int = 256, n: int = 2048) -> dict[str, float]:
    """Read bandwidth and float32 matmul FLOP/s (n^3). The bandwidth is the CPU kernels' own
    probe (`jaxspec.kernels.read_bandwidth`: at least 1 GiB, or `mib` if larger, read by every
    core with the kernels' streaming loop) where the library is built; else a jitted sum over
    `mib` MiB (`bandwidth_probe` says which)."""
    if kernels.available():
        bandwidth = kernels.read_bandwidth(max(mib / 1024, 1.0))
        probe = "kernels.read_bandwidth (C, every core)"
    else:
        x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
        total = jax.jit(jnp.sum)
        total(x).block_until_ready()
        bandwidth = x.nbytes / min(_timed(lambda: total(x).block_until_ready()) for _ in range(5))
        probe = f"a jitted sum over {mib} MiB"
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, a).block_until_ready()
    tm = min(_timed(lambda: mm(a, a).block_until_ready()) for _ in range(3))
    return {"bandwidth_Bps": bandwidth, "flops_per_s": 2 * n**3 / tm, "bandwidth_probe": probe}


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """(the fastest of `repeats` timed calls in wall seconds, the last result), after one
    untimed warm-up call (the compilation). The fastest, not the median: other work on a
    shared machine only ever adds time, so the best run is the least disturbed estimate
    (as `timeit` advises)."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def heldout_texts() -> list[str]:
    """The documents `tools/train_default_models.py` held out of the shipped pair's training,
    read from this Python's standard library (names in `jaxspec/ckpts/models/train_report.json`).
    Falls back to `json/__init__.py` when the report is missing."""
    try:
        names = json.loads(TRAIN_REPORT.read_text())["corpus"]["heldout_names"]
    except (OSError, KeyError, ValueError):
        names = ["stdlib/json/__init__.py"]
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in names:
        kind, _, rel = name.partition("/")
        if kind == "stdlib":
            try:
                texts.append((stdlib / rel).read_text(encoding="utf-8"))
            except OSError:
                continue
        elif kind == "pydoc":
            if rel in topics:
                texts.append(topics[rel])
    return [t for t in texts if t.strip()]


def heldout_stream(model: Any) -> np.ndarray:
    """One token stream `<s> doc </s> <s> doc ...` over the held-out documents (int32); random
    ids when the model has no tokenizer."""
    tok = model.tokenizer
    if tok is None:
        return np.random.RandomState(0).randint(0, model.config.vocab_size, 1 << 16)
    ids: list[int] = []
    for text in heldout_texts():
        ids += [tok.bos_token_id, *tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    return np.asarray(ids, np.int32)


def prompts_from(stream: np.ndarray, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of `length` tokens at seeded random offsets of a token stream."""
    starts = np.random.RandomState(seed).randint(0, len(stream) - length, n)
    return [stream[s : s + length].tolist() for s in starts]


def machine() -> dict[str, Any]:
    """Cores, memory and versions of what ran."""

    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "memory_gib": None if mem is None else round(mem / 2**30, 1),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.machine(),
        "load_average_1min_end": os.getloadavg()[0],  # other work sharing the cores
    }
    for mod in ("torch", "transformers", "flax"):
        m = sys.modules.get(mod)
        if m is not None:
            info[mod] = m.__version__
    return info


def make_scheduler(
    model: Any,
    *,
    rows: Sequence[int],
    gamma: int,
    max_len: int,
    max_sparse_k: int = 16,
    warm: bool = True,
) -> Scheduler:
    """A `verify.Scheduler` with one row bucket per size in `rows` and one width bucket
    (gamma + 1), so every section of a run shares its compilations; warmed up (every shape
    compiled) unless `warm` is False (shapes then compile on first use)."""

    rows = tuple(sorted(set(rows)))
    config = SchedulerConfig(
        max_sessions=rows[-1],
        max_len=max_len,
        max_gamma=gamma,
        max_sparse_k=max_sparse_k,
        row_buckets=rows,
        width_buckets=(gamma + 1,),
    )
    sched = Scheduler(model, config)
    if warm:
        sched.warmup()
    return sched
