"""The layering of docs/design.md §1, read from the imports (function bodies included).

jaxspec (core) <- jaxspec_host (flags, model fetcher, XLA cache) <- verify (cloud), edge
(device) <- jaxspec_apps (CLI, demo, bench); verify and edge never import each other; proofs
imports nothing of the package; the core imports neither argparse nor pip, nor runs pip.
"""

from __future__ import annotations

import collections
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools/import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)
imports = import_graph.imports  # the one import reader (tools/import_graph.py draws with it)
PROJECT = ("jaxspec", "jaxspec_host", "verify", "edge", "jaxspec_apps", "proofs")
# What each package must never import (at any depth in a module). The core holds the model,
# checkpoints, quantization, sampling, the rule and the protocol: no command-line parsing
# (argparse) and no package installer (pip); it finds the model fetcher by entry point.
FORBIDDEN = {
    "jaxspec": {"jaxspec_host", "verify", "edge", "jaxspec_apps", "proofs", "argparse", "pip"},
    "jaxspec_host": {"verify", "edge", "jaxspec_apps", "proofs"},
    "verify": {"edge", "jaxspec_apps", "proofs"},
    "edge": {"verify", "jaxspec_apps", "proofs"},
    "proofs": {"jaxspec", "jaxspec_host", "verify", "edge", "jaxspec_apps"},
    "jaxspec_apps": {"proofs"},
}
RUNS_PIP = ('"pip"', "'pip'")  # a subprocess command naming pip (`python -m pip ...`)


def violations(package: str, source: str) -> list[str]:
    """The layering rules broken by one module of `package`."""
    bad = []
    for mod, at_top in imports(source):
        head = mod.split(".")[0]
        if head in FORBIDDEN[package]:
            bad.append(f"imports {mod}")
        if mod in ("edge.__main__", "verify.__main__"):
            bad.append(f"imports the script module {mod}")
        if package == "jaxspec_apps" and head in PROJECT and not at_top:
            bad.append(f"imports {mod} inside a function (apps import at module top)")
    if package == "jaxspec" and any(p in source for p in RUNS_PIP):
        bad.append("runs pip")
    return bad


def _modules(package: str) -> list[pathlib.Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down_only(package):
    found = {
        str(path.relative_to(ROOT)): v
        for path in _modules(package)
        if (v := violations(package, path.read_text()))
    }
    assert _modules(package), f"no modules found under {package}/"
    assert not found, found


def test_tools_do_not_import_script_modules():
    for path in sorted((ROOT / "tools").glob("*.py")):
        mods = [m for m, _ in imports(path.read_text())]
        assert "edge.__main__" not in mods and "verify.__main__" not in mods, path


@pytest.mark.parametrize(
    ("package", "source"),
    [
        ("jaxspec", "def f():\n    from verify import LocalVerifier\n"),
        ("jaxspec", "import edge.drafter\n"),
        ("jaxspec", "import argparse\n"),
        ("jaxspec", "def f():\n    from jaxspec_host import hub\n"),
        ("jaxspec", "import subprocess\nsubprocess.run(['python', '-m', 'pip', 'download'])\n"),
        ("jaxspec_host", "from verify import LocalVerifier\n"),
        ("verify", "from edge.session import run_session\n"),
        ("edge", "def f():\n    import verify\n"),
        ("proofs", "import jaxspec\n"),
        ("jaxspec_apps", "def f():\n    from edge.drafter import Drafter\n"),
        ("jaxspec_apps", "from edge.__main__ import encode\n"),
    ],
)
def test_the_checker_catches_an_upward_import(package, source):
    """Mutants: each planted import breaks one rule and must be reported."""
    assert violations(package, source)


def test_the_package_graph_has_no_edge_running_up_or_sideways():
    """The picture of docs/design.md §1 (`python tools/import_graph.py`), from the source."""
    found = import_graph.edges(ROOT)
    assert import_graph.violations(found) == []
    # jaxspec: no arrow out
    assert {a for a, _ in found} == {"jaxspec_apps", "verify", "edge", "jaxspec_host"}
    planted = collections.Counter({**found, ("jaxspec", "verify"): 1, ("edge", "verify"): 1})
    assert import_graph.violations(planted) == [("edge", "verify"), ("jaxspec", "verify")]
    assert "NOT ALLOWED" in import_graph.picture(planted)
