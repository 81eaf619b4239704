"""A kept trace's argument and output trees as plain data (JSON), never code: node types by
module and name, looked up among modules already imported (never imported), node data only
as None, bools, numbers, strings and tuples or lists of them (`jaxspec.compilation.trace_cache`
keeps and loads the entries).
"""

from __future__ import annotations

import sys
from typing import Any

import jax

_BUILTIN_NODES = {"tuple": tuple, "list": list, "dict": dict, "None": type(None)}


class Unusable(Exception):
    """A kept entry that must not be loaded (the message says why); it is traced anew."""


def _type_name(kind: type) -> str:
    for name, builtin in _BUILTIN_NODES.items():
        if kind is builtin:
            return name
    if "<locals>" in kind.__qualname__:
        raise TypeError(f"a local class ({kind.__qualname__}) cannot be named in a kept trace")
    return f"{kind.__module__}:{kind.__qualname__}"


def _type_named(name: str) -> type:
    """The node type `name` names, among modules already imported (nothing is imported)."""
    if name in _BUILTIN_NODES:
        return _BUILTIN_NODES[name]
    module, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None and part else None
    if not isinstance(obj, type):
        raise Unusable(f"its tree names {name!r}, which is not a type this process has")
    return obj


def _plain(aux: Any) -> Any:
    """A node's auxiliary data as JSON: None, bools, numbers, strings and tuples or lists of
    them (anything else: TypeError, and the trace is not kept)."""
    if aux is None or type(aux) in (bool, int, float, str):  # (exactly: no enum, no numpy)
        return aux
    if type(aux) in (tuple, list):
        return {type(aux).__name__: [_plain(x) for x in aux]}
    raise TypeError(f"node data of type {type(aux).__name__} cannot be kept")


def _unplain(data: Any) -> Any:
    if isinstance(data, dict):
        ((kind, items),) = data.items()
        values = [_unplain(x) for x in items]
        return {"tuple": tuple, "list": list}[kind](values)
    return data


def tree_to_json(tree: Any) -> Any:
    """A PyTreeDef as plain data: "*" for a leaf, else [type name, node data, children]."""
    if tree.num_nodes == 1 and tree.num_leaves == 1:
        return "*"
    kind, aux = tree.node_data()
    return [_type_name(kind), _plain(aux), [tree_to_json(c) for c in tree.children()]]


def tree_from_json(data: Any) -> Any:
    """The PyTreeDef `tree_to_json` wrote (Unusable when it names no registered node)."""
    if data == "*":
        return jax.tree.structure(0)
    try:
        name, aux, children = data
        node = (_type_named(name), _unplain(aux))
        kids = [tree_from_json(c) for c in children]
        return jax.tree_util.PyTreeDef.from_node_data_and_children(
            jax.tree_util.default_registry, node, kids
        )
    except Unusable:
        raise
    except Exception as e:
        raise Unusable(f"its tree is not one this process can build ({e})") from e
