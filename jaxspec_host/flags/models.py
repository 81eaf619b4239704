"""The models a command runs (`--checkpoint --draft --pair --quantize`, resolved by
`jaxspec_host.pairs.resolve`) and its prompt (`--prompt` or `--chat`)."""

from __future__ import annotations

import argparse

from jaxspec.nn.model import Model
from jaxspec.nn.text import chat_prompt, encode_prompt
from jaxspec_host.pairs import add_pair_flag


def add_prompt_flags(parser: argparse.ArgumentParser) -> None:
    """`--prompt TEXT` (plain continuation) or `--chat TEXT` (one user message through the
    model's chat template; the answer ends at the template's end token). One is required."""
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="text to continue")
    g.add_argument("--chat", help="a user message, sent through the model's chat template")


def prompt_from_args(model: Model, args: argparse.Namespace) -> tuple[tuple[int, ...], str]:
    """`(token ids, text to print before the output)` for `--prompt` or `--chat`: a plain
    prompt is echoed before its continuation (with a tokenizer), a chat prints the answer."""
    if getattr(args, "chat", None) is not None:
        return chat_prompt(model, args.chat), ""
    echo = "" if model.tokenizer is None else args.prompt
    return encode_prompt(model, args.prompt), echo


QUANTIZE = ("w4a16", "w8a16", "none")  # the draft's weights on the edge
ROLES = ("verifier", "edge", "colocated", "demo", "generate")
# What --checkpoint, --draft and --quantize say in each command (the same flags, told from
# where the command stands): `verifier` python -m verify serve; `edge` python -m edge
# generate / serve; `colocated` jaxspec serve; `demo` jaxspec demo; `generate` jaxspec
# generate (co-located decoding: --checkpoint required, no --draft is plain decoding).
MODEL_HELP = {
    "checkpoint": {
        "verifier": "HF checkpoint dir, .gguf file, or a name: smollm2 (fetched on first use), "
        "default (the shipped tiny target); without it, --pair's target",
        "edge": "the target the verifier serves: only its tokenizer and chat template are "
        "loaded, to encode the prompt and decode the answer (default: --pair's)",
        "colocated": "the target: HF checkpoint dir, .gguf file, or a name (default: --pair's)",
        "demo": "target the spawned verifier serves (default: --pair's)",
        "generate": "HF checkpoint dir, .gguf file, or a name: default, default-draft, smollm2",
    },
    "draft": {
        "edge": "draft checkpoint or built-in name (default: --pair's; not with --gamma 0)",
        "colocated": "draft checkpoint or name (default: --pair's)",
        "demo": "draft checkpoint or built-in name (default: --pair's)",
        "generate": "draft checkpoint: speculative decoding (not with --gamma 0, which is "
        "plain decoding)",
    },
    "quantize": {
        "edge": "the draft's weights on this device",
        "colocated": "the draft's weights (as `python -m edge serve` holds them)",
        "demo": "the draft's weights on the edge",
    },
}


def add_model_flags(parser: argparse.ArgumentParser, role: str) -> None:
    """`--checkpoint` (the target), `--draft`, `--pair` and `--quantize` (the draft's
    weights on the edge), those a command in `role` (`ROLES`) has, in that order. Models not
    named are `--pair`'s, a model named alone goes with its own pair's other half
    (`jaxspec_host.pairs.resolve`); `generate` has no `--pair`: its `--checkpoint` is
    required and without `--draft` it decodes plainly."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    helps = {flag: texts[role] for flag, texts in MODEL_HELP.items() if role in texts}
    parser.add_argument(
        "--checkpoint", default=None, required=role == "generate", help=helps["checkpoint"]
    )
    if "draft" in helps:
        parser.add_argument("--draft", default=None, help=helps["draft"])
    if role != "generate":
        add_pair_flag(parser)
    if "quantize" in helps:
        parser.add_argument("--quantize", default="w4a16", choices=QUANTIZE, help=helps["quantize"])
