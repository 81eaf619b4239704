"""What runs around the core on a host: the command-line flags that `python -m verify`,
`python -m edge` and `jaxspec` share (`flags`), the fetcher of models loadable by name
(`hub`, which downloads with pip; the core finds it through the `jaxspec.fetchers` entry
point, never by import) and the XLA compilation cache (`xla_cache`).

Layering (docs/design.md §1): imports the core `jaxspec` only; `verify`, `edge` and the apps
may import it; the core never does.
"""
