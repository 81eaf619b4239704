"""The multi-host verifier: one scheduler, every process's devices (docs/multihost.md).

`python -m verify serve --coordinator host:port --num-processes N --process-id I` starts one
process per host (or per accelerator). `initialize()` joins them through `jax.distributed`;
the mesh ("data", "model") then spans every process's devices. JAX is multi-controller: every
process must run the same jitted computations, in the same order, on global arrays. Process 0
(the leader) binds the gRPC port and runs the scheduler; the others (followers) bind nothing
and only replay the leader's jitted calls:

* `Lockstep.wrap` is the scheduler's hook (`Scheduler(calls=...)`, the only change to the
  single-process path, which keeps calling its two jitted functions unwrapped). Before each
  call of "step" or "prefill" the leader writes the call's host-side inputs (the padded
  batch: small numpy arrays, saved with `np.savez`, zlib-compressed) to JAX's coordination
  service key-value store under a sequence number; then every process turns those host arrays
  into global arrays (rows over "data") and runs the same jitted function on its shards of
  the parameters and the KV pool. The step's per-row results are all-gathered
  (`multihost_utils.process_allgather`, a collective every process runs) so the leader can
  read them; followers drop their copy.
* `Lockstep.follow` is a follower's whole life: read call n, check its sequence number, run
  it, repeat, until the leader writes "stop". A message out of sequence, an unknown call or
  any error in a call raises: the follower exits non-zero (`EXIT_LOCKSTEP`) and never waits
  in a collective the leader will not enter.
* Liveness is the coordination service's own: `initialize` sets `heartbeat_timeout_s` (flag
  `--heartbeat-timeout-s`, default 10) and turns on JAX's recoverability mode, so a dead
  process is reported to the survivors instead of aborting them; a monitor thread in every
  process calls `get_live_nodes` (a barrier among the live processes) every 0.5 s. When a
  follower dies (SIGKILL, OOM, a lost host) the leader learns it within the heartbeat timeout
  (a step in flight fails sooner: the CPU collectives see the closed connection), sets health
  NOT_SERVING (held --drain-min-s), logs why and exits with `EXIT_LOCKSTEP` (3): within
  heartbeat_timeout_s + 2 s of the death, plus that hold (tests/test_multihost.py: 3-5 s
  with a 4 s heartbeat, asserted under heartbeat + 6 s for a loaded machine). When the leader
  dies, the followers lose the coordination service (it lives in process 0) and JAX ends
  them within the same timeout.

Nothing here is a transport or coordinator of our own: the handover is JAX's key-value store,
the liveness its heartbeats, the data path XLA's collectives.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.decoding.sampling import SamplingParams, TokenCounts
from verify.step import DATA, VerifyBatch

log = logging.getLogger("verify.multihost")

EXIT_LOCKSTEP = 3  # the exit status of a process whose lockstep broke (a peer died, a gap)
CALLS = ("step", "prefill", "stop")  # what the leader announces; "stop": followers exit 0
MONITOR_EVERY_S = 0.5
POLL_MS = 1000  # a follower re-checks its own stop deadline this often while the leader idles
STOP_WAIT_S = 10.0  # how long the leader waits for followers to disconnect after "stop"
READY_TIMEOUT_S = 1800  # how long the processes wait for each other to load the target


def initialize(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    heartbeat_timeout_s: int = 10,
) -> tuple[int, int]:
    """Join the job through `jax.distributed` (before anything touches a JAX backend).

    `coordinator` "host:port" of process 0's coordination service, or None / "auto" to let
    JAX detect the coordinator, process count and id (TPU VM pod slices, SLURM, Open MPI,
    Kubernetes); a dead process is reported within `heartbeat_timeout_s` (recoverability on:
    the survivors hear it instead of being aborted, see the module docstring). Returns
    (process id, process count)."""
    if heartbeat_timeout_s < 1:
        raise ValueError(f"--heartbeat-timeout-s must be >= 1, got {heartbeat_timeout_s}")
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        None if coordinator in (None, "auto") else coordinator,
        num_processes,
        process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    return jax.process_index(), jax.process_count()


def _treedef(name: str) -> Any:
    """The structure of a call's host-side arguments (after params and cache)."""
    if name == "prefill":  # tokens, positions, valid [R, C]; slots [R]
        return jax.tree.structure((0, 0, 0, 0))
    if name == "step":  # one VerifyBatch
        fields = {f.name: 0 for f in dataclasses.fields(VerifyBatch)}
        fields["sampling"] = SamplingParams(
            **{f.name: 0 for f in dataclasses.fields(SamplingParams)}
        )
        fields["counts"] = TokenCounts(prompt=0, output=0)
        return jax.tree.structure((VerifyBatch(**fields),))
    return jax.tree.structure(())


def _encode(seq: int, name: str, leaves: list[np.ndarray]) -> bytes:
    buf = io.BytesIO()
    arrays = {f"a{i}": x for i, x in enumerate(leaves)}
    np.savez(buf, meta=np.array([seq, CALLS.index(name), len(leaves)], np.int64), **arrays)
    return zlib.compress(buf.getvalue(), 1)


def _decode(data: bytes) -> tuple[int, str, list[np.ndarray]]:
    with np.load(io.BytesIO(zlib.decompress(data)), allow_pickle=False) as z:
        seq, call, n = (int(v) for v in z["meta"])
        if not 0 <= call < len(CALLS):
            raise RuntimeError(f"lockstep: unknown call {call} in message {seq}")
        return seq, CALLS[call], [z[f"a{i}"] for i in range(n)]


class LockstepBroken(RuntimeError):
    """A follower fell out of step (a gap, an unknown call) or a peer died."""


class Lockstep:
    """Keeps every process's jitted calls the leader's, in the leader's order (module
    docstring). One per process, over the global `mesh`; `client` is JAX's coordination
    service client and `process` (id, count) this process's place (tests give their own)."""

    def __init__(
        self,
        mesh: Mesh,
        *,
        client: Any = None,
        process: tuple[int, int] | None = None,
        prefix: str = "jaxspec/lockstep",
    ):
        self.mesh = mesh
        # JAX's coordination-service client: JAX (0.10) has no public handle on it
        # (`jax.distributed` exports initialize/is_initialized/shutdown only), and its own
        # jax.experimental modules read it here too (tests/test_layering.py allows this one).
        self.client = client if client is not None else jax._src.distributed.global_state.client
        if self.client is None:
            raise RuntimeError("jax.distributed is not initialized (verify.multihost.initialize)")
        self.process_id, self.num_processes = process or (jax.process_index(), jax.process_count())
        self.leader = self.process_id == 0
        self.prefix = prefix
        self.calls = 0  # calls announced (leader) or run (follower)
        self._deleted = 0  # keys 1.._deleted removed from the store (leader)
        self._fns: dict[str, Callable] = {}
        self._stopping = threading.Event()
        self._failed = threading.Lock()
        self._order = threading.Lock()  # announcements (sequence numbers) one at a time
        self._monitor: threading.Thread | None = None
        # What the leader does when the lockstep breaks (`fail`); verify/__main__.py first
        # sets health NOT_SERVING. Must not return.
        self.on_failure: Callable[[str], None] = die

    # ---- both roles ----------------------------------------------------------------------

    def wrap(self, name: str, fn: Callable) -> Callable:
        """The scheduler's hook: `fn(params, cache, *host_args)` run in lockstep."""
        if name not in CALLS[:-1]:
            raise ValueError(f"lockstep: unknown jitted call {name!r}")
        self._fns[name] = fn

        def call(params: Any, cache: Any, *args: Any) -> Any:
            leaves, treedef = jax.tree.flatten(args)
            if treedef != _treedef(name):
                raise LockstepBroken(f"lockstep: {name} arguments changed shape: {treedef}")
            host = [np.asarray(x) for x in leaves]
            try:
                self._announce(name, host)
                return self._run(name, params, cache, host)
            except Exception as e:
                self.fail(f"the {name} call {self.calls} failed: {type(e).__name__}: {e}")
                raise

        return call

    def _key(self, seq: int) -> str:
        return f"{self.prefix}/{seq}"

    def _global(self, x: np.ndarray) -> jax.Array:
        """A host array every process holds whole as one global array: rows over "data" when
        they divide evenly (every batch's rows do), else replicated."""
        data = self.mesh.shape[DATA]
        spec = P(DATA) if x.ndim and x.shape[0] % data == 0 else P()
        return jax.make_array_from_callback(
            x.shape, NamedSharding(self.mesh, spec), lambda index: x[index]
        )

    def _run(self, name: str, params: Any, cache: Any, host: list[np.ndarray]) -> Any:
        args = jax.tree.unflatten(_treedef(name), [self._global(x) for x in host])
        out = self._fns[name](params, cache, *args)
        if name != "step":
            return out
        cache, res = out
        # [R, ...] results sharded over "data": gathered (a collective of every process).
        res = multihost_utils.process_allgather(res, tiled=True)
        if self.leader:  # every follower has run every call up to this one: drop their keys
            for seq in range(self._deleted + 1, self.calls + 1):
                self.client.key_value_delete(self._key(seq))
            self._deleted = self.calls
        return cache, res

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Every process has built its scheduler (target loaded, pool allocated): a barrier of
        the coordination service, so the leader says SERVING only when all can step."""
        self.client.wait_at_barrier(f"{self.prefix}/ready", int(timeout_s * 1000))

    def start_monitor(self) -> None:
        """Watch every process's coordination-service heartbeat (a daemon thread)."""
        self._monitor = threading.Thread(target=self._watch, name="lockstep-monitor", daemon=True)
        self._monitor.start()

    def _watch(self) -> None:
        everyone = list(range(self.num_processes))
        while True:
            try:
                live = self.client.get_live_nodes(everyone)  # a barrier of the live processes
            except Exception as e:
                if not self._stopping.is_set():
                    self.fail(f"the coordination service is unreachable: {e}")
                return
            if len(live) < len(everyone):
                if not self._stopping.is_set():
                    missing = sorted(set(everyone) - set(live))
                    self.fail(
                        f"process(es) {missing} stopped sending heartbeats to the coordination "
                        "service (dead or cut off)"
                    )
                return
            time.sleep(MONITOR_EVERY_S)

    def fail(self, reason: str) -> None:
        """The lockstep is broken: `on_failure(reason)` once (it exits the process)."""
        if self._stopping.is_set() or not self._failed.acquire(blocking=False):
            return
        self.on_failure(reason)

    # ---- the leader ----------------------------------------------------------------------

    def _announce(self, name: str, host: list[np.ndarray]) -> None:
        if not self.leader:
            return
        with self._order:
            if self._stopping.is_set():
                raise LockstepBroken(f"a {name} call after the followers were told to stop")
            self.calls += 1
            self.client.key_value_set_bytes(self._key(self.calls), _encode(self.calls, name, host))

    def stop(self) -> None:
        """Leader: tell the followers to exit 0 and wait (at most STOP_WAIT_S) until they have
        left the coordination service, so none is cut off by the leader's own exit."""
        if not self.leader or self._stopping.is_set():
            return
        with self._order:
            self._stopping.set()
            self.calls += 1
            self.client.key_value_set_bytes(self._key(self.calls), _encode(self.calls, "stop", []))
        if self._monitor is not None and self.num_processes > 1:
            self._monitor.join(STOP_WAIT_S)  # it returns once the followers have disconnected
            if self._monitor.is_alive():
                log.warning("followers still connected %.0f s after stop", STOP_WAIT_S)

    # ---- a follower ----------------------------------------------------------------------

    def follow(self, scheduler: Any, deadline: Callable[[], float | None] = lambda: None) -> int:
        """Follower: run the leader's calls on `scheduler.params` / `scheduler.cache` (the
        scheduler built exactly as the leader's, with `calls=self.wrap`) until "stop": 0.

        `deadline()` (a monotonic time or None) bounds the wait once this process was asked to
        stop (SIGTERM): past it, `LockstepBroken`. A gap or an unknown call raises too."""
        if self.leader:
            raise RuntimeError("the leader does not follow")
        while True:
            seq = self.calls + 1
            data = self._receive(seq, deadline)
            got, name, host = _decode(data)
            if got != seq:
                raise LockstepBroken(f"lockstep: expected call {seq}, the leader sent {got}")
            self.calls = seq
            if name == "stop":
                self._stopping.set()
                return 0
            if name not in self._fns:
                raise LockstepBroken(f"lockstep: call {seq} is {name!r}, not registered here")
            out = self._run(name, scheduler.params, scheduler.cache, host)
            scheduler.cache = out[0] if name == "step" else out

    def _receive(self, seq: int, deadline: Callable[[], float | None]) -> bytes:
        while True:
            try:
                return self.client.blocking_key_value_get_bytes(self._key(seq), POLL_MS)
            except Exception as e:  # DEADLINE_EXCEEDED: the leader is idle
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
            end = deadline()
            if end is not None and time.monotonic() > end:
                raise LockstepBroken(f"asked to stop; no 'stop' from the leader (call {seq})")


def die(reason: str) -> None:
    """Log `reason` and end this process with EXIT_LOCKSTEP at once: a thread may be stuck in
    a collective with the dead peer, and JAX's exit-time shutdown would wait for it."""
    log.error("multi-host lockstep broken: %s; exiting %d", reason, EXIT_LOCKSTEP)
    print(f"jaxspec verifier: multi-host lockstep broken: {reason}", file=sys.stderr, flush=True)
    leave(EXIT_LOCKSTEP)


def leave(code: int) -> None:
    """End a multi-host process with `code`, skipping the interpreter's finalization: the
    monitor (a daemon thread) may be inside a coordination-service call, and a daemon thread
    that comes back from C++ while Python finalizes is unwound by force, which aborts the
    process ("terminate called after throwing an instance of ''", status -6) after a clean
    stop."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
