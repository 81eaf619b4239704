"""A package's names loaded on first use (PEP 562): importing one light submodule (the
protocol's figures, the wire's types) does not load JAX and the model with it.

Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: a name of `exports` (public name -> the
    submodule that defines it) is imported on first use and kept in `namespace` (the
    package's globals); a submodule's own name imports it."""

    def getattr_(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
            namespace[name] = value
            return value
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
