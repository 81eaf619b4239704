"""A training phase that resumes: its saved state, the log, and the loop that steps its
members, plans the step count from the measured step time and checkpoints on the way."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

import numpy as np

from trainlib.logger import Logger
from trainlib.presets import Preset
from trainlib.steps import get_batch, lr_at

STATE_VERSION = 1


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(np.asarray, tree)


def save_state(path: pathlib.Path, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
    """Atomically write arrays (pytrees) and JSON metadata."""
    from flax import serialization

    payload = {k: serialization.to_state_dict(_to_numpy(v)) for k, v in arrays.items()}
    payload["meta"] = json.dumps(meta)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(serialization.msgpack_serialize(payload))
    os.replace(tmp, path)


def load_state(path: pathlib.Path, templates: dict[str, Any]) -> tuple[dict[str, Any], dict]:
    import jax
    import jax.numpy as jnp
    from flax import serialization

    raw = serialization.msgpack_restore(path.read_bytes())
    arrays = {
        k: jax.tree.map(jnp.asarray, serialization.from_state_dict(t, raw[k]))
        for k, t in templates.items()
    }
    return arrays, json.loads(raw["meta"])


class StopRequested(Exception):
    """`--stop-after-steps` was reached (simulated interruption; the state is saved)."""


@dataclasses.dataclass
class PhaseSpec:
    name: str
    phase_id: int
    # member name -> (peak lr, step function caller)
    members: dict[str, float]
    fixed_steps: int | None
    budget_s: float | None


def _start_phase(
    spec: PhaseSpec, state_path: pathlib.Path, init: dict[str, Any], logger: Logger
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arrays, meta) to start the phase from: fresh, or the saved state (`meta["done"]`
    when a previous run finished the phase)."""
    meta: dict[str, Any] = {
        "version": STATE_VERSION,
        "step": 0,
        "total": spec.fixed_steps,
        "elapsed_s": 0.0,
        "step_times": [],
        "done": False,
        "stopped_early": False,
        "history": {m: [] for m in spec.members},
    }
    arrays = dict(init)
    if state_path.exists():
        arrays, meta = load_state(state_path, init)
        if meta["done"]:
            logger.log(f"{spec.name}: done in a previous run ({meta['step']} steps), reusing it")
        else:
            logger.log(f"{spec.name}: resuming at step {meta['step']}/{meta['total'] or '?'}")
    return arrays, meta


def _phase_step(
    spec: PhaseSpec,
    arrays: dict[str, Any],
    meta: dict[str, Any],
    step_call: Any,
    stream: np.ndarray,
    seed: int,
    preset: Preset,
) -> tuple[dict[str, Any], float]:
    """One optimizer step of every member on the batch of (seed, phase, step): (metrics per
    member, seconds)."""
    step = meta["step"]
    batch = get_batch(stream, seed, spec.phase_id, step, preset)
    t0 = time.time()
    metrics = {}
    for member, peak in spec.members.items():
        lr = lr_at(step, meta["total"] or 0, peak, preset)
        metrics[member] = step_call(arrays, member, batch, lr)
    dt = time.time() - t0
    return metrics, dt


def _record_step(
    meta: dict[str, Any], step: int, metrics: dict[str, Any], dt: float, t_phase: float
) -> None:
    meta["step"] = step + 1
    meta["step_times"].append(dt)
    meta["elapsed_s"] = time.time() - t_phase
    for member, m in metrics.items():
        meta["history"][member].append(m)


def _plan_total(
    spec: PhaseSpec, meta: dict[str, Any], prog: Any, task: Any, logger: Logger
) -> None:
    """Plan the total at the end of warmup, from the warm steps' mean time."""
    warm = meta["step_times"][1:] or meta["step_times"]
    per_step = float(np.mean(warm))
    remaining = max(0.0, spec.budget_s - meta["elapsed_s"])
    meta["total"] = max(meta["step"] + 1, meta["step"] + int(remaining / per_step))
    meta["planned_step_s"] = per_step
    prog.update(task, total=meta["total"])
    logger.log(
        f"{spec.name}: {per_step:.2f} s/step measured, planned {meta['total']} steps "
        f"for a budget of {spec.budget_s:.0f} s"
    )


def _stop_over_budget(spec: PhaseSpec, meta: dict[str, Any], logger: Logger) -> bool:
    """Whether the phase ran over 1.3× its time budget before its planned total (then it is
    marked as stopped early)."""
    over = spec.budget_s is not None and meta["elapsed_s"] > 1.3 * spec.budget_s
    if over and meta["step"] < (meta["total"] or 0):
        logger.log(f"{spec.name}: over 1.3× its time budget, stopping at {meta['step']}")
        meta["stopped_early"] = True
        return True
    return False


def run_phase(
    spec: PhaseSpec,
    state_path: pathlib.Path,
    init: dict[str, Any],
    step_call: Any,
    stream: np.ndarray,
    args: argparse.Namespace,
    preset: Preset,
    logger: Logger,
    counter: dict[str, int],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train the members of a phase (resuming from `state_path`), return (params, meta).

    `init` maps "<member>/params" and "<member>/opt" to initial pytrees; `step_call(arrays,
    member, batch, lr)` runs one optimizer step of a member in place and returns its metrics.
    """
    arrays, meta = _start_phase(spec, state_path, init, logger)
    if meta["done"]:
        return arrays, meta

    def checkpoint() -> None:
        save_state(state_path, arrays, meta)

    last_ckpt = time.time()
    with logger.progress() as prog:
        task = prog.add_task(spec.name, total=meta["total"], completed=meta["step"], info="")
        t_phase = time.time() - meta["elapsed_s"]
        while meta["total"] is None or meta["step"] < meta["total"]:
            step = meta["step"]
            metrics, dt = _phase_step(spec, arrays, meta, step_call, stream, args.seed, preset)
            _record_step(meta, step, metrics, dt, t_phase)
            counter["steps"] += 1
            if meta["total"] is None and meta["step"] >= preset.warmup_steps:
                _plan_total(spec, meta, prog, task, logger)
            info = "  ".join(f"{m}: {v['loss']:.3f}" for m, v in metrics.items())
            prog.update(task, completed=meta["step"], info=info)
            if meta["step"] % preset.log_every == 0 or meta["step"] == meta["total"]:
                logger.log(
                    f"{spec.name} step {meta['step']}/{meta['total'] or '?'}  {info}  "
                    f"({dt:.2f} s/step, lr {lr_at(step, meta['total'] or 0, 1.0, preset):.3f}×peak)"
                )
            if _stop_over_budget(spec, meta, logger):
                break
            if time.time() - last_ckpt > preset.checkpoint_every_s:
                checkpoint()
                last_ckpt = time.time()
            if args.stop_after_steps is not None and counter["steps"] >= args.stop_after_steps:
                checkpoint()
                raise StopRequested(f"stopped after {counter['steps']} steps (--stop-after-steps)")
    meta["done"] = True
    checkpoint()
    return arrays, meta
