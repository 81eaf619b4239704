"""The scripts of tools/ as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

TOOLS = pathlib.Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str) -> types.ModuleType:
    """`tools/<name>.py` executed as the module `name` (registered in `sys.modules`, through
    which dataclasses resolve their annotations); it puts tools/ on `sys.path` itself."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
