"""The peer: Hugging Face transformers on the same checkpoints and prompts (torch, CPU).

Greedy, batch 1 (transformers' assisted generation takes one sequence at a time), default
stop tokens on both sides. Per prompt: transformers' plain `generate`, its assisted
generation (`assistant_model=draft`) with its default dynamic draft length and with a
constant draft length gamma, our plain `jaxspec.generate` and our co-located speculative
decoding (gamma, sync). All five must give the same tokens — asserted
(`GreedyMismatch`); then tokens/s are compared as ratios, every decoder timed in turns
within one run (the best of the repeats, after a warm-up).
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jaxspec
from jaxspec.ckpts.checkpoint import BUILTIN_DIR, BUILTIN_NAMES
from jaxspec.quant.layers import quant_spec
from jaxspec.quant.quantize import dequantize
from jaxspec_apps.bench.common import check_same_tokens
from jaxspec_apps.bench.section import Context, Section, sizes
from jaxspec_host import hub

# This section's sizes (HF transformers, greedy, batch 1).
Config = sizes("peer_", prompts=4, new_tokens=128)


QUICK_SIZES = Config(prompts=1, new_tokens=16)
TINY_SIZES = dataclasses.replace(QUICK_SIZES, new_tokens=8)
REAL_SIZES = Config(prompts=3)


def checkpoint_dir(name: str) -> pathlib.Path:
    """A checkpoint directory for a built-in name (`default`, `default-draft`), a fetchable
    name (`smollm2`: its converted cache, pulled if needed) or a path."""

    if name in BUILTIN_NAMES and not pathlib.Path(name).is_dir():
        return BUILTIN_DIR / BUILTIN_NAMES[name]
    if hub.remote_model(name) is not None and not pathlib.Path(name).exists():
        return hub.ensure(name)
    if hub.quantized_copy(name) is not None and not pathlib.Path(name).exists():
        return hub.ensure_copy(name)
    return pathlib.Path(name)


def hf_draft_dir(draft: Any, name: str) -> pathlib.Path:
    """A transformers checkpoint of the draft: a quantized draft dequantized to float32
    (transformers has no int4 kernel of ours), a float one as it is."""
    if quant_spec(draft) is None:
        return checkpoint_dir(name)
    d = pathlib.Path(tempfile.mkdtemp(prefix="jaxspec-bench-draft-"))
    jaxspec.save(dequantize(draft), d)
    return d


def load_hf(path: str | pathlib.Path) -> Any:
    """transformers' model for a checkpoint directory, float32 (our models load as float32)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()  # deprecation chatter about generation kwargs
    transformers.logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def hf_decoders(
    hf_target: Any, hf_draft: Any, new_tokens: int, gamma: int
) -> dict[str, Callable[[list[int]], list[int]]]:
    """prompt -> new tokens, for transformers' plain and assisted greedy generation."""

    import torch

    const = copy.deepcopy(hf_draft)
    const.generation_config.num_assistant_tokens = gamma
    const.generation_config.num_assistant_tokens_schedule = "constant"
    eos = hf_target.generation_config.eos_token_id
    if eos is None:  # a generation_config.json without stop ids: the model's own (config.json)
        eos = hf_target.generation_config.eos_token_id = hf_target.config.eos_token_id

    def make(assistant: Any) -> Callable[[list[int]], list[int]]:
        def decode(prompt: list[int]) -> list[int]:
            x = torch.tensor([prompt])
            kw = {} if assistant is None else {"assistant_model": assistant}
            with torch.no_grad():
                out = hf_target.generate(
                    x, max_new_tokens=new_tokens, do_sample=False, pad_token_id=eos, **kw
                )
            return out[0, len(prompt) :].tolist()

        return decode

    return {"hf_plain": make(None), "hf_assisted": make(hf_draft), "hf_assisted_const": make(const)}


def our_decoders(
    target: Any, draft: Any, new_tokens: int, gamma: int
) -> dict[str, Callable[[list[int]], list[int]]]:
    """prompt -> new tokens, for our plain and co-located speculative greedy decoding."""

    def plain(prompt: list[int]) -> list[int]:
        return jaxspec.generate(target, prompt, new_tokens, temperature=0.0).tokens

    def spec(prompt: list[int]) -> list[int]:
        out = jaxspec.generate(
            target, prompt, new_tokens, temperature=0.0, draft=draft, gamma=gamma
        )
        return out.tokens

    return {"ours_plain": plain, "ours_spec": spec}


def compare(
    decoders: dict[str, Callable[[list[int]], list[int]]],
    prompts: Sequence[Sequence[int]],
    repeats: int,
    reference: str = "hf_plain",
) -> dict[str, Any]:
    """Run every decoder on every prompt (warm-up, then `repeats` timed turns), assert all
    give the `reference`'s tokens, and return tokens/s per decoder over all prompts."""
    seconds = dict.fromkeys(decoders, 0.0)
    tokens = dict.fromkeys(decoders, 0)
    for i, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        outs = {name: fn(prompt) for name, fn in decoders.items()}  # warm-up (compilation)
        for name, got in outs.items():
            check_same_tokens(f"{name} vs {reference}, prompt {i}", got, outs[reference])
        times: dict[str, list[float]] = {name: [] for name in decoders}
        for _ in range(repeats):
            for name, fn in decoders.items():  # in turns: machine noise hits all alike
                t0 = time.perf_counter()
                fn(prompt)
                times[name].append(time.perf_counter() - t0)
        for name in decoders:
            seconds[name] += min(times[name])
            tokens[name] += len(outs[name])
    return {
        "tok_s": {name: tokens[name] / seconds[name] for name in decoders},
        "new_tokens": tokens[reference],
        "prompts": len(prompts),
        "repeats": repeats,
    }


def run(
    target: Any,
    draft: Any,
    target_dir: str | pathlib.Path,
    draft_dir: str | pathlib.Path,
    prompts: Sequence[Sequence[int]],
    *,
    new_tokens: int,
    gamma: int,
    repeats: int,
) -> dict[str, Any]:
    """The comparison on the same checkpoints; ratios ours / theirs. The speculative ratio is
    against the faster of transformers' two assisted settings (the harder bar)."""
    import torch
    import transformers

    hf_target, hf_draft = load_hf(target_dir), load_hf(draft_dir)
    decoders = hf_decoders(hf_target, hf_draft, new_tokens, gamma)
    decoders |= our_decoders(target, draft, new_tokens, gamma)
    res = compare(decoders, prompts, repeats)
    tps = res["tok_s"]
    best_assisted = max(tps["hf_assisted"], tps["hf_assisted_const"])
    return res | {
        "gamma": gamma,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "peer_plain_ratio": tps["ours_plain"] / tps["hf_plain"],
        "peer_spec_ratio": tps["ours_spec"] / best_assisted,
        "hf_assisted_speedup": best_assisted / tps["hf_plain"],
        "ours_spec_speedup": tps["ours_spec"] / tps["ours_plain"],
    }


def run_section(ctx: Context) -> dict[str, Any]:
    """The comparison on the pass's pair and first `peer_prompts` prompts."""
    p = ctx.p
    return run(
        ctx.target, ctx.draft, checkpoint_dir(ctx.target_name),
        hf_draft_dir(ctx.draft, ctx.draft_name), ctx.prompts[: p.peer.prompts],
        new_tokens=p.peer.new_tokens, gamma=p.gamma, repeats=p.repeats,
    )  # fmt: skip


SECTION = Section("peer", run_section, requires=("torch",))
