"""`python -m verify serve`: the verifier service (start-up in verify/serve.py).

    python -m verify serve --port 50051          # SmolLM2-135M-Instruct, loopback, open
    python -m verify serve --pair tiny --port 50051           # the shipped tiny target, offline
    python -m verify serve --checkpoint ckpt --host 0.0.0.0 --port 443 \\
        --tenants tenants.toml --tls-cert cert.pem --tls-key key.pem --mesh data=4,model=2

The target: `--checkpoint`, else `--pair` (jaxspec_host.pairs, as `jaxspec demo` and `python -m
edge generate` choose): SmolLM2-135M-Instruct when it can be had (fetched once, said on stderr
with the cache directory), else the shipped tiny target, said in one line.

Start-up, in this order: flags are checked (a non-loopback `--host` without both `--tenants`
and TLS is refused unless `--allow-insecure-public`), the port is bound (a busy one fails at
once, exit 2) and `jaxspec verifier listening on <host>:<port>, warming up: N shapes` printed;
health says NOT_SERVING while the target loads and every step shape compiles (each logged,
with the time so far; compiled executables go to JAX's persistent cache, see
`--compilation-cache`, so the next start loads them); then one line
`jaxspec verifier serving <checkpoint> on <host>:<port>` once it takes requests (with
`--metrics-port`, the line goes on `, metrics on http://<metrics host>:<port>/metrics`; the
metrics bind to loopback unless `--metrics-host` says otherwise, whatever `--host` is).
SIGTERM (or Ctrl-C) drains: health NOT_SERVING, new sessions UNAVAILABLE, blocks already
received answered, then exit 0. During the start-up it exits at once (exit 0), not waiting for
the load or the compilation in progress (a worker thread, abandoned; multi-host: the leader
stops after the shape being compiled, which its followers compile too); a Ctrl-C before the
port is bound (fetching SmolLM2, loading a target without a config.json) says "interrupted",
exit 130.

Multi-host (docs/multihost.md): `--coordinator host:port --num-processes N --process-id I` on
each of N processes (`--coordinator auto`: JAX detects all three, e.g. on a TPU VM pod slice);
`--mesh` then counts every process's devices. Process 0 binds the port and serves as above;
the others print `jaxspec verifier follower I/N: no gRPC port (process 0 serves), ...`, bind
nothing and replay process 0's jitted calls (`verify.multihost`) until it drains; a dead
process makes the others exit 3 (the leader first says NOT_SERVING).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

import jaxspec
from jaxspec.compilation.shapes import shape_name, warmup_order
from jaxspec.nn.model import Model
from jaxspec_host.flags import (
    add_verifier_serve_flags,
    command_parser,
    interrupted,
    parse_command_line,
    refuse_shadowed_package,
    use_compilation_cache,
)
from jaxspec_host.pairs import resolve
from jaxspec_host.preflight import (
    checkpoint_config,
    checkpoint_vocab,
    refuse_pair_with_models,
    refuse_sessionless,
    refuse_unaffordable_cache,
)
from jaxspec_host.worker import exit_if_abandoned, in_thread
from verify import multihost
from verify.local import LocalVerifier
from verify.mesh import mesh_problem
from verify.scheduler import Scheduler, SchedulerConfig, WarmupCancelled
from verify.serve import (
    HANDSHAKE_TIMEOUT_S,
    ConnectionLimits,
    Server,
    bind,
    insecure_public_reason,
    rate_limit_client_caused_logs,
    scheduler_config_from_args,
)
from verify.servicer import FIRST_MESSAGE_TIMEOUT_S, WRITE_TIMEOUT_S
from verify.step import make_mesh
from verify.tenants import ANONYMOUS, Tenants

log = logging.getLogger("verify")


def build_parser() -> argparse.ArgumentParser:
    """`python -m verify serve`'s flags (`jaxspec_host.flags.add_verifier_serve_flags`), the
    defaults that are the verifier's own passed from here."""
    p, sub = command_parser("python -m verify", "the jaxspec verifier")
    s = sub.add_parser("serve", help="serve jaxspec.v1.Verifier over gRPC")
    timeouts = {
        "write_timeout_s": WRITE_TIMEOUT_S,
        "handshake_timeout_s": HANDSHAKE_TIMEOUT_S,
        "first_message_timeout_s": FIRST_MESSAGE_TIMEOUT_S,
        **dataclasses.asdict(ConnectionLimits()),
    }
    add_verifier_serve_flags(s, SchedulerConfig, timeouts)
    return p


def connection_limits_from_args(args: argparse.Namespace) -> ConnectionLimits:
    """The connection limits the flags describe; `ValueError` names a bad flag."""
    names = [f.name for f in dataclasses.fields(ConnectionLimits)]
    try:
        return ConnectionLimits(**{name: getattr(args, name) for name in names})
    except ValueError as e:
        name, _, rest = str(e).partition(" ")
        raise ValueError(f"--{name.replace('_', '-')} {rest}") from None


def resolve_target(args: argparse.Namespace) -> str:
    """Fill `args.checkpoint` from `--pair` when not given (`jaxspec_host.pairs`: SmolLM2 when
    it can be had, fetched once and said on stderr, else the tiny target, said in one line);
    the checkpoint. The verifier needs no draft, so no W4A16 copy is built."""
    say = functools.partial(log.warning, "%s")
    refuse_pair_with_models(args.pair, args.checkpoint, None)
    args.checkpoint = resolve(args.checkpoint, None, args.pair, drafts=False, say=say).target
    return args.checkpoint


def refuse_unaffordable(args: argparse.Namespace, config: SchedulerConfig) -> None:
    """A KV slot pool past the memory available (`jaxspec_host.preflight`), refused before
    the target loads."""
    itemsize = jnp.dtype(args.dtype).itemsize
    refuse_unaffordable_cache(args.checkpoint, config.max_sessions, config.max_len, itemsize)


def load_target(args: argparse.Namespace) -> Model:
    """The target the flags name (no tokenizer: the verifier works on token ids)."""
    return jaxspec.load(args.checkpoint, dtype=getattr(jnp, args.dtype), tokenizer=False)


def make_verifier(
    args: argparse.Namespace,
    model: Model | None = None,
    lockstep: multihost.Lockstep | None = None,
) -> LocalVerifier:
    """Build the verifier the flags describe over `model` (loaded from the flags if None);
    multi-host: its jitted calls go through `lockstep` (over the global mesh)."""
    config = scheduler_config_from_args(args)  # before loading: bad flags fail fast
    data, model_par = args.mesh
    if lockstep is not None:
        scheduler = Scheduler(
            model or load_target(args), config, mesh=lockstep.mesh, calls=lockstep.wrap
        )
        return LocalVerifier(scheduler=scheduler)
    mesh = make_mesh(data, model_par) if data * model_par > 1 else None
    return LocalVerifier(model or load_target(args), config, mesh=mesh)


def refuse_unfit_mesh(args: argparse.Namespace) -> None:
    """`ValueError` when --mesh cannot hold the target (`verify.mesh`: an axis that does not
    divide the KV heads, the MLP or the slots), read from its config before any weight
    loads; nothing when the config cannot be read so cheaply (loading then says)."""
    data, model_par = args.mesh
    read = checkpoint_config(args.checkpoint)
    if read is None or data * model_par == 1:
        return
    config, group_size = read
    why = mesh_problem(
        config, data, model_par, max_sessions=args.max_sessions, group_size=group_size,
        name=args.checkpoint,
    )  # fmt: skip
    if why is not None:
        raise ValueError(why)


def is_multihost(args: argparse.Namespace) -> bool:
    """Whether the flags ask for a multi-host verifier (any of the three flags)."""
    return any(x is not None for x in (args.coordinator, args.num_processes, args.process_id))


def join(args: argparse.Namespace) -> multihost.Lockstep:
    """Multi-host: join the job (`jax.distributed`) and build the lockstep over a mesh of
    every process's devices (`--mesh` must count them all)."""
    multihost.initialize(
        args.coordinator, args.num_processes, args.process_id, args.heartbeat_timeout_s
    )
    data, model_par = args.mesh
    if data * model_par != jax.device_count():
        raise ValueError(
            f"--mesh data={data},model={model_par} must cover all {jax.device_count()} devices "
            f"of the {jax.process_count()} processes"
        )
    return multihost.Lockstep(make_mesh(data, model_par))


def follow(args: argparse.Namespace, lockstep: multihost.Lockstep) -> int:
    """A follower process: no port; build the same scheduler, replay the leader's calls."""
    config = scheduler_config_from_args(args)
    resolve_target(args)
    use_compilation_cache(args)
    print(
        f"jaxspec verifier follower {lockstep.process_id}/{lockstep.num_processes}: no gRPC "
        f"port (process 0 serves), running its steps on {len(jax.local_devices())} devices",
        flush=True,
    )
    stop_by: list[float] = []  # SIGTERM: keep following (the leader drains) for a bounded time
    grace = args.drain_timeout_s + 2 * args.heartbeat_timeout_s
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_by or stop_by.append(time.monotonic() + grace))
    lockstep.start_monitor()
    scheduler = Scheduler(load_target(args), config, mesh=lockstep.mesh, calls=lockstep.wrap)
    try:
        lockstep.ready()
        code = lockstep.follow(scheduler, lambda: stop_by[0] if stop_by else None)
    except Exception as e:
        multihost.die(f"{type(e).__name__}: {e}")
    log.info("the leader stopped after %d calls; exiting", lockstep.calls)
    jax.distributed.shutdown()
    return code


def refuse_insecure_public(args: argparse.Namespace) -> str | None:
    """Why the flags would open the verifier to the network unprotected (None: they do not,
    or --allow-insecure-public says the operator means it)."""
    if args.allow_insecure_public:
        return None
    tls = args.tls_cert is not None or args.tls_key is not None
    return insecure_public_reason(args.host, tenants=args.tenants is not None, tls=tls)


# The flags `verify.serve.bind` takes as they are (its keywords of the same names).
_BIND_FLAGS = ("host", "port", "reflection", "metrics_port", "metrics_host",
               "write_timeout_s", "handshake_timeout_s", "first_message_timeout_s")  # fmt: skip


async def _serve(args: argparse.Namespace, lockstep: multihost.Lockstep | None = None) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        with open(args.tls_key, "rb") as k, open(args.tls_cert, "rb") as c:
            tls = (k.read(), c.read())
    if args.tenants:
        tenants = Tenants.load(args.tenants)
    else:
        tenants = Tenants(None)
        log.warning(
            "no --tenants file: no authentication, every caller is accepted as tenant %r "
            "(anyone who can reach %s; give --tenants FILE to require tokens)",
            ANONYMOUS, args.host,
        )  # fmt: skip
    config = scheduler_config_from_args(args)  # bad flags fail before anything is bound
    limits = connection_limits_from_args(args)
    for flag in _BIND_FLAGS[-3:]:  # the timeouts
        if not getattr(args, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    overcommitted = tenants.overcommitted(config.max_sessions)
    if overcommitted is not None:  # allowed (slots are shared first come), but said at start
        log.warning("%s", overcommitted)
    cache = use_compilation_cache(args)
    log.info("compilation cache: %s", cache or "off")
    refuse_sessionless(config.max_len, config.max_gamma)
    resolve_target(args)  # after every flag's check: it may fetch SmolLM2 (once)
    refuse_unaffordable(args, config)  # before the target loads
    refuse_unfit_mesh(args)
    model = None
    vocab = checkpoint_vocab(args.checkpoint)
    if vocab is None:  # no config.json to read cheaply: loading says what is wrong
        model = load_target(args)
        vocab = model.config.vocab_size
    flags = {name: getattr(args, name) for name in _BIND_FLAGS}
    server = await bind(config, vocab, tenants=tenants, tls=tls, limits=limits, **flags)
    if lockstep is not None:  # a dead process: NOT_SERVING, then exit 3 (verify.multihost)
        lockstep.on_failure = functools.partial(
            _lockstep_failed, asyncio.get_running_loop(), server, args.drain_min_s
        )
        lockstep.start_monitor()
    try:
        return await _warm_up_and_serve(args, server, model, vocab, tls is not None, lockstep)
    finally:
        await server.stop(grace=1.0)


def _lockstep_failed(
    loop: asyncio.AbstractEventLoop, server: Server, hold_s: float, reason: str
) -> None:
    """The leader's end when a process died: health NOT_SERVING (set within 2 s, then held
    `hold_s`, --drain-min-s, so health checkers see it before the port closes), exit 3."""
    log.error("multi-host: %s; health NOT_SERVING, exiting %d", reason, multihost.EXIT_LOCKSTEP)
    try:
        asyncio.run_coroutine_threadsafe(server.health.enter_graceful_shutdown(), loop).result(2)
        time.sleep(hold_s)
    except Exception as e:  # exiting anyway
        log.error("could not set health NOT_SERVING: %s", e)
    multihost.die(reason)


async def _warm_up_and_serve(
    args: argparse.Namespace,
    server: Server,
    model: Model | None,
    vocab: int,
    tls: bool,
    lockstep: multihost.Lockstep | None = None,
) -> int:
    """Load the target and compile the first shapes (health NOT_SERVING meanwhile), serve
    (the other shapes compiling in the background), and drain on SIGTERM/SIGINT: exit 0
    (also when stopped while warming up)."""
    warm = _WarmUp.plan(args, scheduler_config_from_args(args), lockstep)
    print(
        f"jaxspec verifier listening on {args.host}:{server.port}{' (TLS)' if tls else ''}, "
        f"warming up: {warm.shapes} shapes{' (--no-warmup)' if args.no_warmup else ''}"
        + (f", serving after the first {len(warm.first)}" if warm.rest else ""),
        flush=True,
    )
    stop = _stop_on_signals()
    warm.t0 = time.monotonic()  # its log lines count from here
    warm.report = server.warming  # Stats' warming_done/warming_total
    server.warming(0, warm.shapes)
    verifier = await _prepare_unless_stopped(warm, stop, args, model, vocab, lockstep)
    if verifier is None:  # SIGTERM while warming up: nothing to drain
        return 0
    await server.ready(verifier)
    background = warm.the_rest_in_background(verifier)
    m = server.metrics
    extra = f", metrics on http://{m.host}:{m.port}/metrics" if m is not None else ""
    print(
        f"jaxspec verifier serving {args.checkpoint} on {args.host}:{server.port}"
        f"{' (TLS)' if tls else ''}{extra}",
        flush=True,
    )
    await stop.wait()
    if background is not None:
        warm.cancel.set()  # no more shapes; the one being compiled is not waited for
    log.warning("draining: no new sessions; answering the blocks already received")
    await server.drain(args.drain_timeout_s, args.drain_min_s)
    return 0


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set (in place of their default ends)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _prepare_unless_stopped(
    warm: _WarmUp,
    stop: asyncio.Event,
    args: argparse.Namespace,
    model: Model | None,
    vocab: int,
    lockstep: multihost.Lockstep | None,
) -> LocalVerifier | None:
    """The verifier, loaded and warmed up (`_WarmUp.prepare`, in a daemon worker thread: the
    health service keeps answering); None when `stop` came first: the thread is abandoned
    mid-load or mid-compilation (neither can be interrupted; SmolLM2's take tens of
    seconds), so the command exits at once. Multi-host, the leader waits for the shape being
    compiled: its followers compile it in lockstep."""
    prepared = in_thread(warm.prepare, args, model, vocab, lockstep, name="verify-warm-up")
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({prepared, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not prepared.done():
        log.warning("stopping: interrupted while warming up")
        warm.cancel.set()
        if lockstep is not None:
            await asyncio.gather(prepared, return_exceptions=True)
        return None
    stopped.cancel()
    return prepared.result()


@dataclasses.dataclass
class _WarmUp:
    """The warm-up of `python -m verify serve`: the step shapes to compile (`order`, none
    with --no-warmup), `first` of them before serving and the `rest` in the background
    while serving; `cancel` (SIGTERM) stops it after the shape being compiled; `t0` is
    when it started (its log lines give the time since)."""

    order: list[tuple[str, int, int, int]]
    first: list[tuple[str, int, int, int]]
    rest: list[tuple[str, int, int, int]]
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    t0: float = dataclasses.field(default_factory=time.monotonic)
    report: Callable[[int, int], None] | None = None  # hears (done, total) per shape

    @classmethod
    def plan(
        cls, args: argparse.Namespace, config: SchedulerConfig, lockstep: multihost.Lockstep | None
    ) -> _WarmUp:
        """Serve once a lone session's shapes are compiled (the smallest row bucket: its
        prefill and every step width); the rest compile in the background, between steps.
        Multi-host and --full-warmup compile everything first."""
        order = [] if args.no_warmup else warmup_order(config)
        partial = bool(order) and lockstep is None and not args.full_warmup
        first = order[: 1 + len(config.width_buckets)] if partial else order
        return cls(order, first, order[len(first) :])

    @property
    def shapes(self) -> int:
        return len(self.order)

    def progress(self, done: int, total: int, shape: str) -> None:
        """Log one compiled shape; `WarmupCancelled` once `cancel` is set."""
        log.info("warm-up: %d/%d shapes compiled (%s), %.1f s", done, self.shapes, shape,
                 time.monotonic() - self.t0)  # fmt: skip
        if self.report is not None:
            self.report(done, self.shapes)
        if self.cancel.is_set():
            raise WarmupCancelled

    def prepare(
        self,
        args: argparse.Namespace,
        model: Model | None,
        vocab: int,
        lockstep: multihost.Lockstep | None,
    ) -> LocalVerifier:
        """Load the target (unless `model` is it), build the verifier, compile `first`
        (in a worker thread); multi-host: wait until every follower has loaded too."""
        target = model or load_target(args)
        if target.config.vocab_size != vocab:
            raise ValueError(f"{args.checkpoint}: config.json and the loaded target disagree")
        log.info("loaded %s in %.1f s", args.checkpoint, time.monotonic() - self.t0)
        verifier = make_verifier(args, target, lockstep)
        if lockstep is not None:
            lockstep.ready()  # every follower has loaded the target too
        if self.first:
            verifier.scheduler.warmup(self.progress, self.first)
        return verifier

    def the_rest_in_background(self, verifier: LocalVerifier) -> asyncio.Future | None:
        """Start compiling `rest` in a worker thread while `verifier` serves (the future of
        that; None when nothing is left to compile)."""
        if not self.rest:
            if self.shapes:
                log.info("warmed up: %d shapes in %.1f s", self.shapes, time.monotonic() - self.t0)
            return None
        log.info(
            "partially warm: serving with %d/%d shapes compiled in %.1f s; compiling the "
            "other %d in the background (a request that needs one waits for it)",
            len(self.first), self.shapes, time.monotonic() - self.t0, len(self.rest),
        )  # fmt: skip
        return in_thread(self._compile_the_rest, verifier, name="verify-compile-rest")

    def _compile_the_rest(self, verifier: LocalVerifier) -> None:
        """Compile `rest` one by one while the verifier serves (a worker thread), ahead of
        time: nothing runs and no state changes, so steps go on meanwhile (the lock is held
        only to read the shapes' arguments). A request that needs a shape not compiled yet
        compiles it on first use (jit) and waits for that. Stops at the first
        `WarmupCancelled` from `progress` (SIGTERM)."""
        for i, shape in enumerate(self.rest, len(self.first) + 1):
            verifier.precompile(shape)  # the lock for the shapes only, not the compilation
            try:
                self.progress(i, 0, shape_name(shape))
            except WarmupCancelled:
                return
        log.info("fully warm: %d shapes in %.1f s", self.shapes, time.monotonic() - self.t0)


def main(argv: Sequence[str] | None = None) -> int:
    # before parsing: --help would work, then fail
    shadowed = refuse_shadowed_package("python -m verify")
    if shadowed is not None:
        return shadowed
    args = parse_command_line(build_parser(), argv)
    refused = refuse_insecure_public(args)
    if refused is not None:  # before anything loads or binds
        print(f"python -m verify serve: error: {refused}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    logging.getLogger("verify").setLevel(logging.INFO)
    rate_limit_client_caused_logs()
    lockstep = None
    try:
        if is_multihost(args):
            config = scheduler_config_from_args(args)  # the flags, the target and the mesh
            refuse_sessionless(config.max_len, config.max_gamma)  # are checked in every
            resolve_target(args)  # process before any joins or loads
            refuse_unaffordable(args, config)
            refuse_unfit_mesh(args)
            lockstep = join(args)
            if not lockstep.leader:
                multihost.leave(follow(args, lockstep))
        try:
            code = asyncio.run(_serve(args, lockstep))
        finally:
            if lockstep is not None:  # no event loop (health) any more
                lockstep.on_failure = multihost.die
        if lockstep is not None:
            lockstep.stop()  # the followers exit 0 too
            multihost.leave(code)
        return exit_if_abandoned(code)  # stopped mid-compilation: exit now, not at its end
    except (ValueError, OSError, RuntimeError) as e:
        print(f"python -m verify serve: error: {e}", file=sys.stderr)
        return leave_on_error(lockstep, str(e), 2)
    except KeyboardInterrupt:  # before the port is bound (SIGINT then drains, above)
        return interrupted("python -m verify serve")
    except Exception as e:  # a bug of ours: the traceback follows, the followers hear why
        leave_on_error(lockstep, f"{type(e).__name__}: {e}", None)
        raise


def leave_on_error(lockstep: multihost.Lockstep | None, reason: str, code: int | None) -> int:
    """A multi-host leader leaving on an error tells its followers why (`Lockstep.abort`:
    they say so and exit 3, instead of finding the coordination service gone), then exits
    `code` (None: returns, for the caller to raise). Anyone else: `code`."""
    if lockstep is not None and lockstep.leader:
        lockstep.on_failure = multihost.die  # no event loop (health) any more
        lockstep.abort(reason)
        if code is not None:
            multihost.leave(code)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
