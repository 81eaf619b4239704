"""Shared fixtures: tiny HF checkpoints built once per session (compiles are shared too)."""

from __future__ import annotations

import jax
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """name -> (checkpoint dir, transformers oracle model) for every config variant."""
    from jaxspec.testing import config_variants, write_hf_checkpoint

    out = {}
    for i, (name, cfg) in enumerate(config_variants().items()):
        d = tmp_path_factory.mktemp(f"hf_{name}")
        out[name] = (d, write_hf_checkpoint(d, cfg, seed=i))
    return out


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_code():
    """Drop compiled executables after each module. Every XLA CPU executable maps code pages;
    one pytest process compiling the whole suite passed the kernel's 65,530 mappings per
    process (vm.max_map_count) and XLA segfaulted in its next compile."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()
