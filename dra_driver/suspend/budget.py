"""Host-memory budget for suspended state: a suspend that would not fit is refused up front."""

from __future__ import annotations

import threading


def fits(capacity_bytes: int, held_bytes: int, request_bytes: int) -> bool:
    """Pure decision: does ``request_bytes`` more fit under ``capacity_bytes``?"""
    if request_bytes < 0:
        raise ValueError(f"request_bytes must be >= 0, got {request_bytes}")
    return held_bytes + request_bytes <= capacity_bytes


class HostMemoryBudget:
    """Thread-safe ledger of host memory held (or reserved) by suspended workloads, by pod UID."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"host memory budget must be >= 0 bytes, got {capacity_bytes}")
        self._capacity = capacity_bytes
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    def held_bytes(self, key: str | None = None) -> int:
        with self._lock:
            if key is not None:
                return self._held.get(key, 0)
            return sum(self._held.values())

    def try_reserve(self, key: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``key`` (replacing what it held) if it fits; else change nothing."""
        with self._lock:
            others = sum(v for k, v in self._held.items() if k != key)
            if not fits(self._capacity, others, nbytes):
                return False
            self._held[key] = nbytes
            return True

    def force(self, key: str, nbytes: int) -> None:
        """Record state that already exists in host memory (a re-registration after a restart),
        even past the budget: it is there whether we like it or not."""
        with self._lock:
            self._held[key] = nbytes

    def release(self, key: str) -> int:
        with self._lock:
            return self._held.pop(key, 0)
