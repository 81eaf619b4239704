"""The one notice of transformers that says nothing to jaxspec's users, dropped.

`import transformers` without torch prints "PyTorch was not found. Models won't be
available…"; jaxspec uses transformers for tokenizers only, which need no torch, so every
command printed a warning about nothing. `drop_no_torch_notice` runs when jaxspec is imported,
before any of its modules imports transformers. Standard library only.
"""

from __future__ import annotations

import logging


class NoTorchNotice(logging.Filter):
    """Drops transformers' "PyTorch was not found" notice; every other message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


def drop_no_torch_notice() -> None:
    """Install `NoTorchNotice` on transformers' logger (once per process)."""
    logger = logging.getLogger("transformers")
    if not any(isinstance(f, NoTorchNotice) for f in logger.filters):
        logger.addFilter(NoTorchNotice())
