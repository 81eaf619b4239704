"""The sampling flags (`--temperature --top-k --top-p --seed --min-p --logit-bias`) and the
penalties, and the one `SamplingSettings` made of them.

    p = argparse.ArgumentParser()
    add_sampling_flags(p, temperature=0.7, top_k=None, top_p=None)  # None: no such flag
    sampling = sampling_from_args(args, model_settings)  # the one SamplingSettings

Each command keeps its own defaults (passed here) and leaves out the flags it has no use
for; the names, types and help texts are the same everywhere. Making the settings is the
check, so a bad flag fails before anything loads.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping

from jaxspec.protocol import SamplingSettings
from jaxspec_host.flags.command import add_flags

SAMPLING_HELP = {
    "temperature": "sampling temperature; 0 = greedy (default %(default)s)",
    "top_k": "keep the k most likely tokens; 0 = off (default %(default)s)",
    "top_p": "keep the smallest set of tokens with this much mass; 1 = off (default %(default)s)",
    "seed": "session seed: every draw is keyed by (seed, position) (default %(default)s)",
    "min_p": "keep tokens at least this fraction as likely as the most likely; 0 = off "
    "(default %(default)s)",
    "logit_bias": "ID:BIAS,... added to those tokens' logits first (greedy too), e.g. "
    "'2:-100' bans token 2; at most 32, each within +-100",
}


def add_sampling_flags(
    parser: argparse.ArgumentParser,
    *,
    temperature: float | None = 1.0,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    seed: int | None = 0,
    min_p: float | None = 0.0,
    logit_bias: str | None = "",
    helps: Mapping[str, str] | None = None,
    from_model: bool = False,
) -> None:
    """Add `--temperature --top-k --top-p --seed --min-p --logit-bias` with these defaults; a
    flag whose default is None is left out. `helps` replaces the help text of some (by
    destination name). `--logit-bias` is text ("ID:BIAS,ID:BIAS"): `logit_bias_from_args`
    parses it.

    `from_model`: `--temperature --top-k --top-p` left unset default to the model's own
    generation settings with `--chat` (`jaxspec.generation_defaults`), else to the values
    given here; the command passes those settings to `sampling_from_args` once it knows them
    (the unset flags stay None in `args`)."""
    if from_model:
        fallback = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        types = {"temperature": float, "top_k": int, "top_p": float}
        for dest, value in fallback.items():
            if value is None:
                continue
            text = {**SAMPLING_HELP, **(helps or {})}[dest].replace(" (default %(default)s)", "")
            parser.add_argument(
                "--" + dest.replace("_", "-"),
                type=types[dest],
                default=None,
                help=f"{text} (default: the model's generation setting with --chat, else {value})",
            )
        parser.set_defaults(sampling_fallback={k: v for k, v in fallback.items() if v is not None})
        temperature = top_k = top_p = None
    flags = {
        "temperature": (temperature, float, None),
        "top_k": (top_k, int, None),
        "top_p": (top_p, float, None),
        "seed": (seed, int, None),
        "min_p": (min_p, float, None),
        "logit_bias": (logit_bias, str, None),
    }
    add_flags(parser, flags, SAMPLING_HELP, helps)


PENALTY_HELP = {
    "repetition_penalty": "divide the positive logits (multiply the others) of tokens in the "
    "prompt or the output so far by this; within [0.01, 100], 1 = off (default %(default)s)",
    "presence_penalty": "subtract this from the logit of every token already in the output; "
    "within +-2, 0 = off (default %(default)s)",
    "frequency_penalty": "subtract this times its count in the output from each token's "
    "logit; within +-2, 0 = off (default %(default)s)",
}
PENALTY_DEFAULTS = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def add_penalty_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--repetition-penalty --presence-penalty --frequency-penalty` (vLLM's semantics,
    `jaxspec.decoding.sampling`), off by default; `penalties_from_args` reads and checks them."""
    add_flags(
        parser, {k: (v, float, None) for k, v in PENALTY_DEFAULTS.items()}, PENALTY_HELP, None
    )


def penalties_from_args(args: argparse.Namespace) -> dict[str, float]:
    """The penalty flags by `SamplingSettings` field name (the defaults for flags a command
    left out); `sampling_from_args` checks them with the rest."""
    return {k: float(getattr(args, k, v)) for k, v in PENALTY_DEFAULTS.items()}


MODEL_SAMPLING = ("temperature", "top_k", "top_p")  # what a model's settings give a chat


def model_sampling(model_settings: Mapping[str, float], unset: Collection[str]) -> dict:
    """What a chat takes from the model's own generation settings (`model_settings`, from
    `jaxspec.generation_defaults`): its temperature, top_k (an int; a GGUF stores a float)
    and top_p, for the fields in `unset` (those no flag or request field gave). The one rule
    of `edge generate --chat`, `jaxspec generate --chat` and the OpenAI endpoint's chats."""
    return {
        k: int(model_settings[k]) if k == "top_k" else float(model_settings[k])
        for k in MODEL_SAMPLING
        if k in model_settings and k in unset
    }


def _from_model(args: argparse.Namespace, settings: Mapping[str, float]) -> dict[str, float]:
    """The `from_model` flags left unset whose value the model's `settings` give (with
    `--chat` only: a plain continuation keeps the command's defaults)."""
    if getattr(args, "chat", None) is None:
        return {}
    fallback = getattr(args, "sampling_fallback", {})
    return model_sampling(settings, [d for d in fallback if getattr(args, d, None) is None])


def sampling_from_args(
    args: argparse.Namespace, model_settings: Mapping[str, float] | None = None
) -> SamplingSettings:
    """The one `SamplingSettings` of parsed flags (`add_sampling_flags`, `add_penalty_flags`):
    a flag the command left out takes the settings' default; a `from_model` flag left unset
    takes the model's `model_settings` (`jaxspec.generation_defaults`) with `--chat`, else the
    command's own default (also before the model is known: `model_settings` None). Making
    the settings is the check: `InvalidArgument` (a `ValueError`) naming the bad value."""
    fallback = getattr(args, "sampling_fallback", {})
    values: dict = {}
    for dest in ("temperature", "top_k", "top_p", "min_p"):
        value = getattr(args, dest, None)
        if value is None:
            value = fallback.get(dest)
        if value is not None:
            values[dest] = value
    values |= _from_model(args, model_settings or {})
    return SamplingSettings(
        **values, logit_bias=logit_bias_from_args(args), **penalties_from_args(args)
    )


def sampling_for_model(
    args: argparse.Namespace, model_settings: Mapping[str, float]
) -> tuple[SamplingSettings, str]:
    """A session's settings once the model is known, and what they take from the model in
    words ("" when nothing; e.g. "temperature 0.2, top_p 0.9 from the model's generation
    settings"). The settings `check_args` made (`args.sampling`) unless the model's
    `model_settings` fill an unset flag (`--chat`): then made once more, with them.
    Only settings that apply are said: when decoding is greedy (temperature 0, given or
    taken), the truncation settings (top_k, top_p) change nothing and go unsaid."""
    taken = _from_model(args, model_settings)
    sampling = getattr(args, "sampling", None)
    if taken or not isinstance(sampling, SamplingSettings):
        sampling = sampling_from_args(args, model_settings)
    if sampling.temperature == 0:
        taken = {k: v for k, v in taken.items() if k not in ("top_k", "top_p", "min_p")}
    said = [f"{dest} {value:g}" for dest, value in taken.items()]
    return sampling, f"{', '.join(said)} from the model's generation settings" if said else ""


def logit_bias_from_args(args: argparse.Namespace) -> dict[int, float]:
    """`--logit-bias "15:-100,42:2.5"` as `{15: -100.0, 42: 2.5}` ({} when absent); raises
    `ValueError` for an entry that is not ID:BIAS (`SamplingSettings` checks the values)."""
    text = getattr(args, "logit_bias", "") or ""
    out: dict[int, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        tok, sep, bias = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(tok)] = float(bias)
        except ValueError:
            raise ValueError(f"--logit-bias entries are ID:BIAS, got {item!r}") from None
    return out
