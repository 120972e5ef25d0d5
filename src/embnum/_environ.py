"""Environment variables set for a block: what child processes started in it inherit."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """``os.environ`` updated with ``values`` inside the block, restored after it (a variable
    unset before is unset again)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
