"""jaxspec's CPU kernels: one C++ library, one loader, one set of controls.

`library` loads the library (XLA FFI handlers built from `csrc/`) and holds the controls
every kernel shares (`available`, `status`, `isa` / `set_isa`, `threads` / `set_threads`,
`read_bandwidth`); `dense`, `attention`, `int4` (its layouts in `int4_layout`) and `int8` are
the kernels. Without the library every model runs on XLA's own ops.
"""

from jaxspec.kernels.library import (
    ISA_NAMES,
    TARGETS,
    available,
    isa,
    library,
    library_path,
    read_bandwidth,
    set_isa,
    set_threads,
    status,
    threads,
    why_unavailable,
)

__all__ = [
    "ISA_NAMES",
    "TARGETS",
    "available",
    "isa",
    "library",
    "library_path",
    "read_bandwidth",
    "set_isa",
    "set_threads",
    "status",
    "threads",
    "why_unavailable",
]
