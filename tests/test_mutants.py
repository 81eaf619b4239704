"""The mutants themselves (`tests/mutants.py`): each is run by a test that must catch it, and
`injected` cannot silently leave the code as built in place."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import pytest

from jaxspec.decoding import sampling, speculative, verification
from tests.mutants import MUTANTS, injected, replacement

TESTS = pathlib.Path(__file__).parent


def test_every_mutant_is_run_by_a_test():
    """A mutant no test names is a check nobody runs: each name is in a test file besides
    this one (and tests/mutants.py)."""
    sources = "\n".join(
        p.read_text() for p in TESTS.glob("test_*.py") if p.name != "test_mutants.py"
    )
    unused = [name for name in MUTANTS if f'"{name}"' not in sources]
    assert not unused


def test_a_mutant_that_never_runs_fails_its_test():
    """Entered and left without running the code it replaces: an AssertionError, not a pass."""
    with pytest.raises(AssertionError, match="never ran"):
        with injected("nonstrict_accept"):
            pass


def test_injected_puts_the_mutant_in_place_and_takes_it_out():
    real = verification._accepts
    with injected("nonstrict_accept"):
        assert verification._accepts is not real
        verification._accepts(jnp.float32(0), jnp.float32(0.5), jnp.float32(0))
    assert verification._accepts is real
    assert speculative.draft_q_for.__module__ == "jaxspec.decoding.speculative"
    assert verification.uniforms is sampling.uniforms


def test_unknown_names_are_refused():
    with pytest.raises(KeyError):
        with injected("no_such_mutant"):
            pass


def test_a_mutant_changes_what_it_replaces():
    """The one-function mutants called directly give another answer than the real function
    where the rule says one (the strict accept test at u = 0, p(d) = 0)."""
    args = (jnp.float32(0), jnp.float32(0.5), jnp.float32(0))
    assert not bool(verification._accepts(*args))
    assert bool(replacement("nonstrict_accept")(*args))
