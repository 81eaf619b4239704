"""Shared fixtures: tiny HF checkpoints built once per session (compiles are shared too)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# One persistent XLA compilation cache for the whole run (every xdist worker and every server
# subprocess inherits it): a step that one module, worker or spawned verifier compiled is
# loaded, not compiled again, by the next. It starts empty each run, so the suite's time is a
# cold run's. Set before JAX is imported (JAX reads these variables then).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxspec-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA:CPU without LLVM's expensive optimizations: the suite is mostly compiling small
# programs once and running them a few times (measured: tests/test_speculative.py alone
# 150 s -> 108 s; the SmolLM2 tests, whose matmuls run in our kernels, within 4%). Every
# comparison in the suite is between programs compiled the same way, and subprocesses
# inherit it. JAXSPEC_TEST_XLA_OPT=1 keeps XLA's defaults.
if os.environ.get("JAXSPEC_TEST_XLA_OPT") != "1":
    _fast = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_fast}".strip()
# Models fetched by name (`jaxspec.load("smollm2")`) go to a fresh directory per run, so the
# tests fetch and convert them as a user's first use does (once per run; workers and servers
# inherit it). Set JAXSPEC_HOME to reuse a cache across runs. The user's own cache is noted
# first: tests of a model too large to fetch per run use it where it holds the model.
os.environ.setdefault(
    "JAXSPEC_USER_HOME",
    os.environ.get("JAXSPEC_HOME")
    or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "jaxspec"),
)
if "JAXSPEC_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="jaxspec-tests-home-")
    os.environ["JAXSPEC_HOME"] = _home
    atexit.register(shutil.rmtree, _home, ignore_errors=True)

import jax
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_numpy_rank_promotion", "raise")
# In case a plugin imported JAX before this file ran.
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """name -> (checkpoint dir, transformers oracle model) for every config variant."""
    from tests.fixtures import config_variants, write_hf_checkpoint

    out = {}
    for i, (name, cfg) in enumerate(config_variants().items()):
        d = tmp_path_factory.mktemp(f"hf_{name}")
        out[name] = (d, write_hf_checkpoint(d, cfg, seed=i))
    return out


@pytest.fixture(scope="module")
def x64():
    """float64 for a whole module (exact decisions): `pytestmark = pytest.mark.usefixtures("x64")`.
    A context, not a global flip: a LocalVerifier's worker thread takes the setting in force
    where the verifier was made."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def isa_restored():
    """The CPU kernels back on their best instruction set after a test that pinned one."""
    yield
    from jaxspec import kernels

    if kernels.available():
        kernels.set_isa("best")


@pytest.fixture(autouse=True)
def _no_kept_traces():
    """Every test traces its own code: a command run in-process (its `main`) turns on the
    kept traces (`jaxspec.compilation.trace_cache`) with the compilation cache, and a later test
    that swaps in a deliberately wrong function (a mutant) must not be served the right one's
    trace from disk. Only tests/test_trace_cache.py turns them on, in a directory of its own."""
    from jaxspec.compilation import trace_cache

    trace_cache.configure(None)
    yield
    trace_cache.configure(None)


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_code():
    """Drop compiled executables after each module. Every XLA CPU executable maps code pages;
    one pytest process compiling the whole suite passed the kernel's 65,530 mappings per
    process (vm.max_map_count) and XLA segfaulted in its next compile."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()


# The files that take longest (compilation-bound, measured with --durations) go first, so
# that with two xdist workers (`-n 2`, files kept whole) no long file starts last while the
# other worker has nothing left to do. Within a file the order is unchanged.
SLOW_FILES_FIRST = (
    "test_smollm2.py",
    "test_speculative.py",
    "test_verifier.py",
    "test_grpc.py",
    "test_stop_tokens.py",
    "test_quantize.py",
    "test_edge_session.py",
    "test_drafter.py",
    "test_bench.py",
    "test_model.py",
    "test_verifier_stateful.py",
    "test_train_tools.py",
    "test_demo.py",
    "test_grpc_faults.py",
    "test_generate.py",
    "test_verification.py",
    "test_cli.py",
    "test_serve_startup.py",
    "test_proofs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
