"""What a section of `jaxspec bench` is, and what the sections of one pass share.

A `Section` is one measurement: `run(ctx)` measures and returns a JSON-able dict; its part of
BENCHMARKS.md and its plots are written from that dict alone by `jaxspec_apps.bench.render`.
Each pair (`jaxspec_apps.bench.tiny`,
`jaxspec_apps.bench.real`) lists the sections of its suite, which `jaxspec bench` runs in
order into `bench/results.json`, and the sections it keeps apart (`--sections adaptive`, ...:
one run each, their own `bench/<name>.json` and `.md`, a block of BENCHMARKS.md between
markers naming the command).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import jaxspec
from jaxspec_apps.bench.common import (
    GreedyMismatch,
    heldout_stream,
    make_scheduler,
    measure_roofline,
)
from jaxspec_host.xla_cache import bound_compiled_programs
from verify import Scheduler


def sizes(prefix: str, /, *, flags: dict[str, str] | None = None, **defaults: Any) -> type:
    """A section's sizes: a frozen dataclass `Config` with one field per default (typed as the
    default is), which `jaxspec bench --set <prefix><field>=VALUE` sets (or, for a field in
    `flags`, `--set <its flag>=VALUE`); `jaxspec_apps.bench.profile` holds one per section."""
    fields = [
        (name, _kind(v), dataclasses.field(default=v, metadata={"flag": (flags or {}).get(name)}))
        for name, v in defaults.items()
    ]
    return dataclasses.make_dataclass(
        "Config", fields, frozen=True, kw_only=True, namespace={"PREFIX": prefix}
    )


def _kind(value: Any) -> Any:
    """The type a size's default `value` has (a tuple's: of its first item's type)."""
    if isinstance(value, tuple):
        return tuple[type(value[0]), ...] if value else tuple[str, ...]
    return type(value)


def _no_failures(data: dict[str, Any]) -> list[str]:
    return []


@dataclasses.dataclass(frozen=True)
class Section:
    """One section: `run` measures (`jaxspec_apps.bench.render` writes its part of the report
    from what it returns). `requires`: modules of the `test` extra it
    needs (missing: the section is skipped, not failed). `failures`: for a section kept
    apart, what in its results fails the command (the suite's fail by `GreedyMismatch`)."""

    name: str
    run: Callable[[Context], dict[str, Any]]
    requires: tuple[str, ...] = ()
    failures: Callable[[dict[str, Any]], list[str]] = _no_failures


@dataclasses.dataclass
class Context:
    """What the sections of one pair's pass share: the pair (`tiny` or `real`), its sizes
    `p`, the models (loaded on first use), the prompts, and one verifier and one roofline
    measured on first use, so compilations and measurements are paid once. `prompts`: the
    tiny pair's held-out windows, or the real pair's first prompt of each Spec-Bench
    category (`by_category` holds them all)."""

    pair: str
    p: Any  # a `profile.Profile` (which imports the sections, for their configs)
    log: Callable[[str], None]
    target_name: str
    draft_name: str
    command: str
    prompts: list[list[int]] = dataclasses.field(default_factory=list)
    by_category: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)
    max_len: int = 0  # the shared verifier's slot length
    sched_rows: tuple[int, ...] = ()  # its row buckets
    _shared: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @functools.cached_property
    def target(self) -> jaxspec.Model:
        return jaxspec.load(self.target_name)

    @functools.cached_property
    def draft(self) -> jaxspec.Model:
        return jaxspec.load(self.draft_name)

    @functools.cached_property
    def stream(self) -> np.ndarray:
        """The held-out token stream (`common.heldout_stream`) in the target's tokens."""
        return heldout_stream(self.target)

    @property
    def pool(self) -> list[list[int]]:
        """Every Spec-Bench prompt (the real pair's clients send these)."""
        return [q for ps in self.by_category.values() for q in ps]

    def sched(self) -> Scheduler:
        """The warmed-up verifier the sections share (row buckets `sched_rows`)."""
        if "sched" not in self._shared:
            rows = sorted(set(self.sched_rows))
            self._shared["sched"] = make_scheduler(
                self.target, rows=rows, gamma=self.p.gamma, max_len=self.max_len
            )
            who = f"{self.pair} pair: " if self.pair != "tiny" else ""
            self.log(f"{who}verifier warmed up: row buckets {rows}, slot length {self.max_len}")
        return self._shared["sched"]

    def roof(self) -> dict[str, float]:
        """This machine's roofline (`common.measure_roofline` at the profile's sizes)."""
        if "roof" not in self._shared:
            self._shared["roof"] = measure_roofline(self.p.roofline_mib, self.p.roofline_n)
        return self._shared["roof"]


def run_sections(
    sections: Sequence[Section], ctx: Context, out: dict[str, Any], prefix: str = ""
) -> None:
    """Run `sections` in order into `out["sections"]` (each with its `wall_s`). A greedy
    mismatch goes to `out["failures"]`, a section whose `requires` module is not installed
    (torch: the `test` extra), or that returns a `skipped` reason, to `out["skipped"]`; the
    others still run. `prefix` starts each log line (which pair)."""
    for section in sections:
        t0 = time.time()
        try:
            for module in section.requires:
                importlib.import_module(module)
            data = section.run(ctx)
        except GreedyMismatch as e:
            out["failures"][section.name] = str(e)
            ctx.log(f"{prefix}{section.name}: GREEDY MISMATCH: {e}")
            continue
        except ModuleNotFoundError as e:
            if e.name not in section.requires:
                raise
            out.setdefault("skipped", {})[section.name] = (
                f"{e.name} is not installed (pip install -e .[test])"
            )
            ctx.log(f"{prefix}{section.name}: skipped, {e.name} is not installed")
            continue
        if "skipped" in data:
            out.setdefault("skipped", {})[section.name] = data["skipped"]
            ctx.log(f"{prefix}{section.name}: skipped, {data['skipped']}")
            continue
        data["wall_s"] = time.time() - t0
        out["sections"][section.name] = data
        ctx.log(f"{prefix}{section.name}: done in {data['wall_s']:.0f} s")
        if bound_compiled_programs():  # a long run of many shapes: keep clear of the maps limit
            ctx.log(f"{prefix}compiled programs dropped after {section.name} (memory maps)")
