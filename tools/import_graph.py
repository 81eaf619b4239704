"""The package-level import graph, read from the source: who imports whom, and how often.

    python tools/import_graph.py          # the picture docs/design.md §1 shows
    python tools/import_graph.py --dot    # Graphviz (dot -Tsvg) of the same edges
    python tools/import_graph.py --core   # the rooms of jaxspec/ and their arrows

Every import statement counts, those inside function bodies too (`imports` is what
tests/test_layering.py checks the layering with). An edge is drawn from the importing
package to the imported one; `jaxspec` at the bottom means no arrow leaves it.
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import sys
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("jaxspec_apps", "verify", "edge", "proofs", "jaxspec_host", "jaxspec")  # top down
ALLOWED = {  # docs/design.md §1: what each package may import of the others
    "jaxspec_apps": {"verify", "edge", "jaxspec_host", "jaxspec"},
    "verify": {"jaxspec_host", "jaxspec"},
    "edge": {"jaxspec_host", "jaxspec"},
    "proofs": set(),
    "jaxspec_host": {"jaxspec"},
    "jaxspec": set(),
}


def imports(source: str) -> list[tuple[str, bool]]:
    """(module imported, at module top?) for every absolute import statement in `source`."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, id(node) in top))
    return out


def edges(root: pathlib.Path = ROOT) -> collections.Counter[tuple[str, str]]:
    """(importer, imported) package pairs -> number of import statements, over the project's
    packages (a package's imports of itself are left out)."""
    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for mod, _ in imports(path.read_text()):
                head = mod.split(".")[0]
                if head in PACKAGES and head != pkg:
                    found[pkg, head] += 1
    return found


def violations(found: collections.Counter[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges the layering does not allow (upward or sideways)."""
    return sorted((a, b) for a, b in found if b not in ALLOWED[a])


def picture(found: collections.Counter[tuple[str, str]]) -> str:
    """One line per package, top to bottom, with what it imports (import statements counted);
    `NOT ALLOWED` marks an edge that runs up or sideways."""
    rank = {p: i for i, p in enumerate(PACKAGES)}
    bad = set(violations(found))
    lines = []
    for pkg in PACKAGES:
        outs = sorted((rank[b], b, n) for (a, b), n in found.items() if a == pkg)
        targets = ", ".join(
            f"{b} ({n})" + (" NOT ALLOWED" if (pkg, b) in bad else "") for _, b, n in outs
        )
        lines.append(f"{pkg + '/':14} -> {targets or 'nothing of the project'}")
    return "\n".join(lines)


def core_edges(root: pathlib.Path = ROOT) -> collections.Counter[tuple[str, str]]:
    """(importer, imported) rooms of the core (jaxspec's subpackages; "jaxspec" for its
    top-level modules) -> number of import statements, a room's imports of itself left out.
    The package face (jaxspec/__init__.py: lazy public names) is not a room."""

    def room(parts: Sequence[str]) -> str:
        return (
            parts[1]
            if len(parts) > 2 or (len(parts) == 2 and (root / "jaxspec" / parts[1]).is_dir())
            else "jaxspec"
        )

    found: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in sorted((root / "jaxspec").rglob("*.py")):
        if path == root / "jaxspec" / "__init__.py":
            continue
        here = room(path.relative_to(root).with_suffix("").parts)
        for mod, _ in imports(path.read_text()):
            parts = mod.split(".")
            if parts[0] == "jaxspec" and len(parts) > 1 and (there := room(parts)) != here:
                found[here, there] += 1
    return found


def core_picture(found: collections.Counter[tuple[str, str]]) -> str:
    rooms = sorted({r for pair in found for r in pair})
    return "\n".join(
        f"{r + '/':14} -> "
        + (", ".join(f"{b} ({n})" for (a, b), n in sorted(found.items()) if a == r) or "nothing")
        for r in rooms
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dot", action="store_true", help="print Graphviz instead of text")
    p.add_argument("--core", action="store_true", help="the rooms of jaxspec/ instead")
    args = p.parse_args(argv)
    if args.core:
        print(core_picture(core_edges()))
        return 0
    found = edges()
    if args.dot:
        body = "".join(f'  "{a}" -> "{b}" [label={n}];\n' for (a, b), n in sorted(found.items()))
        print("digraph imports {\n  rankdir=TB;\n" + body + "}")
    else:
        print(picture(found))
    return 1 if violations(found) else 0


if __name__ == "__main__":
    sys.exit(main())
