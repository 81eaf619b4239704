"""Benchmark sizes. `full` is the committed report: the shipped tiny pair at these sizes, then
the real pair (SmolLM2 and its W4A16 draft) at the `real` sizes; `quick` keeps CI honest in
under two minutes; `tiny` is for tests with tiny random checkpoints.

A `Profile` holds what a pass shares (gamma, prompt length, timed repeats, the roofline's
sizes) and each section's own frozen `Config` (in the section's module, with its
`QUICK_SIZES`, `TINY_SIZES` and `REAL_SIZES`). Every size can be set for one run
(`jaxspec bench --set NAME=VALUE`, `with_settings`), a section's by its config's `PREFIX` +
field name (`fleet_seconds`, `gammas`). The sections run only when named (`--sections
adaptive`, ...) record their sizes in their own results, not in `profile_settings`
(`suite_settings`)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

import jaxspec_apps.bench.adaptive as adaptive
import jaxspec_apps.bench.capacity as capacity
import jaxspec_apps.bench.colocated as colocated
import jaxspec_apps.bench.fleet as fleet
import jaxspec_apps.bench.int4 as int4
import jaxspec_apps.bench.latency as latency
import jaxspec_apps.bench.openai as openai
import jaxspec_apps.bench.peer as peer
import jaxspec_apps.bench.quality as quality
import jaxspec_apps.bench.roundprofile as roundprofile
import jaxspec_apps.bench.specbench as specbench
import jaxspec_apps.bench.target as target
import jaxspec_apps.bench.twoproc as twoproc
import jaxspec_apps.bench.verifier as verifier
import jaxspec_apps.bench.wirecost as wirecost

# profile field -> the module whose `Config` it holds; the suite's first, then the kept ones
SUITE = {
    "colocated": colocated,
    "peer": peer,
    "capacity": capacity,
    "latency": latency,
    "verifier": verifier,
    "wirecost": wirecost,
    "quality": quality,
    "specbench": specbench,
}
KEPT = {
    "adaptive": adaptive,
    "fleet": fleet,
    "openai": openai,
    "target": target,
    "int4": int4,
    "round_profile": roundprofile,
    "two_process": twoproc,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """What a pass shares, and each section's `Config` (fields named as in `SUITE`, `KEPT`)."""

    name: str
    gamma: int = 4  # the speculation length every section uses (swept in `colocated`)
    prompt_len: int = 32
    repeats: int = 5  # timed repeats per measurement (the best counts), after a warm-up
    roofline_mib: int = 256
    roofline_n: int = 2048
    real_prompt_tokens: int | None = None  # cut the real pair's prompts (tiny models)
    real_profile: bool = False  # the real pair's pass uses `REAL`'s sizes, else these
    default_pairs: str = "tiny"  # what `--pairs` defaults to: tiny, real or both
    colocated: colocated.Config = dataclasses.field(default_factory=colocated.Config)
    peer: peer.Config = dataclasses.field(default_factory=peer.Config)
    capacity: capacity.Config = dataclasses.field(default_factory=capacity.Config)
    latency: latency.Config = dataclasses.field(default_factory=latency.Config)
    verifier: verifier.Config = dataclasses.field(default_factory=verifier.Config)
    wirecost: wirecost.Config = dataclasses.field(default_factory=wirecost.Config)
    quality: quality.Config = dataclasses.field(default_factory=quality.Config)
    specbench: specbench.Config = dataclasses.field(default_factory=specbench.Config)
    adaptive: adaptive.Config = dataclasses.field(default_factory=adaptive.Config)
    fleet: fleet.Config = dataclasses.field(default_factory=fleet.Config)
    openai: openai.Config = dataclasses.field(default_factory=openai.Config)
    target: target.Config = dataclasses.field(default_factory=target.Config)
    int4: int4.Config = dataclasses.field(default_factory=int4.Config)
    round_profile: roundprofile.Config = dataclasses.field(default_factory=roundprofile.Config)
    two_process: twoproc.Config = dataclasses.field(default_factory=twoproc.Config)


def _configs(*kinds: str) -> dict[str, Any]:
    """Each section's first of the sizes `kinds` ("QUICK_SIZES", ...) it has, else its
    default."""
    out = {}
    for field, module in (SUITE | KEPT).items():
        have = [getattr(module, k) for k in kinds if hasattr(module, k)]
        out[field] = have[0] if have else module.Config()
    return out


PROFILES = {
    "full": Profile(name="full", real_profile=True, default_pairs="both"),
    "quick": Profile(
        name="quick", repeats=1, roofline_mib=32, roofline_n=512, **_configs("QUICK_SIZES")
    ),
    # One length and one batch size wherever possible: sections then share compilations;
    # one prompt length (real_prompt_tokens): every prompt shares the compilations.
    "tiny": Profile(
        name="tiny",
        repeats=1,
        prompt_len=8,
        roofline_mib=8,
        roofline_n=256,
        real_prompt_tokens=24,
        **_configs("TINY_SIZES", "QUICK_SIZES"),
    ),
}
# A 135M target on 2 cores: one prompt per category where the tiny pair takes four, no
# sweep of gamma or mode (Spec-Bench's T = 0 table is the headline), fewer clients.
REAL = Profile(name="real", repeats=1, **_configs("REAL_SIZES"))


def real_sizes(p: Profile) -> Profile:
    """The sizes of the real pair's pass in a run of profile `p`."""
    return REAL if p.real_profile else p


def _shared() -> list[str]:
    return [f.name for f in dataclasses.fields(Profile) if f.name not in SUITE | KEPT]


def _flags(field: str, config: Any) -> dict[str, str]:
    """Section config `config`'s `--set` names -> its field names."""
    return {
        f.metadata.get("flag") or config.PREFIX + f.name: f.name for f in dataclasses.fields(config)
    }


def suite_settings(p: Profile) -> dict[str, Any]:
    """The sizes the suite's sections read, by their `--set` names
    (`results["profile_settings"]`)."""
    out = {name: getattr(p, name) for name in _shared()}
    for field in SUITE:
        config = getattr(p, field)
        out |= {flag: getattr(config, name) for flag, name in _flags(field, config).items()}
    return out


def with_settings(p: Profile, items: Sequence[str]) -> Profile:
    """`p` with `NAME=VALUE` items (`--set`) in place of its sizes: numbers as numbers,
    tuples comma-separated, booleans true/false, `none` for an optional value."""
    where: dict[str, tuple[str | None, str]] = {n: (None, n) for n in _shared() if n != "name"}
    for field in SUITE | KEPT:
        where |= {k: (field, v) for k, v in _flags(field, getattr(p, field)).items()}
    for item in items:
        flag, sep, value = item.partition("=")
        flag = flag.strip().replace("-", "_")
        if not sep or flag not in where:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME a size of "
                             f"the profile ({', '.join(sorted(where))})")  # fmt: skip
        field, name = where[flag]
        owner = p if field is None else getattr(p, field)
        try:
            parsed = _parse(typing.get_type_hints(type(owner))[name], value.strip())
        except ValueError as e:
            raise ValueError(f"--set {item!r}: {e}") from None
        changed = dataclasses.replace(owner, **{name: parsed})
        p = changed if field is None else dataclasses.replace(p, **{field: changed})
    return p


def _parse(kind: Any, value: str) -> Any:
    """`value` as type `kind` (a size's)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        return tuple(_parse(args[0], v.strip()) for v in value.split(",") if v.strip())
    if type(None) in args:  # X | None
        return None if value.lower() == "none" else _parse(args[0], value)
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{value!r} is not true or false")
        return value.lower() in ("true", "1", "yes")
    return kind(value)
