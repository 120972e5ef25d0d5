"""A small bounded cache that many threads may share.

Calls from several threads at once (a data loader, a training loop) share the
module-level caches of validation results and device tables; a plain dict
evicted with ``pop(next(iter(d)))`` raises ``KeyError`` or ``RuntimeError``
when two threads evict together. Every operation here holds one lock.
"""

from __future__ import annotations

import threading


class BoundedCache:
    """A dict of at most ``maxsize`` entries, the oldest evicted first; thread-safe."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._data: dict = {}
        self._lock = threading.Lock()

    def get(self, key, default=None):
        with self._lock:
            return self._data.get(key, default)

    def put(self, key, value):
        """Store ``value`` unless another thread stored one first; return the stored value."""
        with self._lock:
            if key in self._data:
                return self._data[key]
            while len(self._data) >= self.maxsize:
                del self._data[next(iter(self._data))]
            self._data[key] = value
            return value

    def drop(self, key) -> None:
        """Forget ``key`` (nothing happens when it is absent)."""
        with self._lock:
            self._data.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
