"""The applications above the libraries: the `jaxspec` command, its live demo and the
benchmark suite.

They wire the cloud side (`verify`) and the edge side (`edge`) together, so they live above
both; `jaxspec`, `verify` and `edge` import nothing from here.
"""
