"""The layering of docs/design.md §1, read from the imports (function bodies included).

jaxspec (core) <- verify (cloud), edge (device) <- jaxspec_apps (CLI, demo, bench);
verify and edge never import each other; proofs imports nothing of the package.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = ("jaxspec", "verify", "edge", "jaxspec_apps", "proofs")
# What each package must never import (at any depth in a module).
FORBIDDEN = {
    "jaxspec": {"verify", "edge", "jaxspec_apps", "proofs"},
    "verify": {"edge", "jaxspec_apps", "proofs"},
    "edge": {"verify", "jaxspec_apps", "proofs"},
    "proofs": {"jaxspec", "verify", "edge", "jaxspec_apps"},
    "jaxspec_apps": {"proofs"},
}


def imports(source: str) -> list[tuple[str, bool]]:
    """(module imported, at module top?) for every import statement in `source`."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, id(node) in top))
    return out


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
