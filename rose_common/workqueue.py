"""A keyed, de-duplicated work queue with per-key exponential backoff (in-process, no I/O).

Semantics of client-go's rate-limited work queue, in short:

- :meth:`WorkQueue.add` queues a key once: adding a key already queued does nothing; adding a key
  that a worker is processing marks it dirty, and it is queued again when :meth:`WorkQueue.done`
  is called, so one key is never processed by two workers at a time and no change is lost.
- :meth:`WorkQueue.requeue` queues a key after ``after`` seconds, or after the key's own
  exponential backoff (``initial * 2**failures``, capped) when ``after`` is None;
  :meth:`WorkQueue.forget` resets that backoff (call it on success).
- The queue is bounded: :meth:`WorkQueue.add` returns False when ``max_len`` keys wait.
- :meth:`WorkQueue.shutdown` wakes every worker; :meth:`WorkQueue.get` then returns None.

:func:`run_worker` is the worker loop: ``get``, call the handler, ``done``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("rose.workqueue")


@dataclass(frozen=True)
class Backoff:
    """Per-key retry delays: ``initial_s * 2**(failures-1)``, at most ``max_s``."""

    initial_s: float = 1.0
    max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")

    def delay(self, failures: int) -> float:
        """The delay before retry number ``failures`` (>= 1)."""
        return float(min(self.max_s, self.initial_s * 2 ** min(max(failures - 1, 0), 62)))


class WorkQueue(Generic[K]):
    """Keys to work on; see the module docstring for the rules."""

    def __init__(
        self,
        name: str,
        *,
        backoff: Backoff | None = None,
        max_len: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_len < 1:
            raise ValueError(f"work queue {name}: max_len must be >= 1, got {max_len}")
        self.name = name
        self.backoff = backoff or Backoff()
        self.max_len = max_len
        self._clock = clock
        self._cv = threading.Condition()
        self._ready: deque[K] = deque()
        self._queued: set[K] = set()  # in _ready
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while processing: queue again on done()
        self._delayed: list[tuple[float, int, K]] = []  # (due, seq, key) heap
        self._due: dict[K, float] = {}  # key -> earliest due time among its delayed entries
        self._failures: dict[K, int] = {}
        self._seq = itertools.count()
        self._shutdown = False

    # ------------------------------------------------------------------ producers
    def add(self, key: K) -> bool:
        """Queue ``key`` now (once); False when the queue is full or shut down."""
        with self._cv:
            return self._add_locked(key)

    def _add_locked(self, key: K) -> bool:
        if self._shutdown:
            return False
        if key in self._queued:
            return True
        if key in self._processing:
            self._dirty.add(key)
            return True
        if len(self._ready) >= self.max_len:
            log.warning("work queue full; key dropped", extra={"queue": self.name, "maxLen": self.max_len})
            return False
        self._ready.append(key)
        self._queued.add(key)
        self._cv.notify()
        return True

    def requeue(self, key: K, after: float | None = None) -> float:
        """Queue ``key`` again after ``after`` seconds, or after its next backoff delay (which
        counts a failure) when ``after`` is None; returns the delay used."""
        with self._cv:
            if after is None:
                self._failures[key] = self._failures.get(key, 0) + 1
                after = self.backoff.delay(self._failures[key])
            if after <= 0:
                self._add_locked(key)
                return 0.0
            due = self._clock() + after
            if self._due.get(key, float("inf")) > due:
                self._due[key] = due
                heapq.heappush(self._delayed, (due, next(self._seq), key))
                self._cv.notify()
            return after

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (its work succeeded)."""
        with self._cv:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cv:
            return self._failures.get(key, 0)

    def waiting(self, key: K) -> bool:
        """True while ``key`` waits for a delayed requeue."""
        with self._cv:
            return key in self._due

    def __len__(self) -> int:
        with self._cv:
            return len(self._ready)

    def idle(self) -> bool:
        """Nothing queued or being processed (delayed keys do not count)."""
        with self._cv:
            return not self._ready and not self._processing

    # ------------------------------------------------------------------ workers
    def get(self, timeout: float | None = None) -> K | None:
        """The next key to work on (it is now being processed); None on shutdown or timeout."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cv:
            while True:
                self._promote_due()
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                if self._shutdown:
                    return None
                wait = self._next_wait(deadline)
                if wait is not None and wait <= 0:
                    return None
                self._cv.wait(wait)

    def _promote_due(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            due, _, key = heapq.heappop(self._delayed)
            if self._due.get(key) == due:
                del self._due[key]
                self._add_locked(key)

    def _next_wait(self, deadline: float | None) -> float | None:
        now = self._clock()
        waits = [self._delayed[0][0] - now] if self._delayed else []
        if deadline is not None:
            if deadline <= now:
                return 0.0
            waits.append(deadline - now)
        return max(min(waits), 0.001) if waits else None

    def done(self, key: K) -> None:
        """The worker finished ``key``; a key added meanwhile is queued again now."""
        with self._cv:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key)
            self._cv.notify_all()

    def shutdown(self) -> None:
        with self._cv:
            self._shutdown = True
            self._cv.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests and shutdown: True once nothing is queued or processed."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._ready or self._processing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
            return True


def run_worker(queue: WorkQueue[K], handle: Callable[[K], None]) -> None:
    """Process keys until shutdown; ``handle`` decides on ``forget`` / ``requeue`` itself. An
    exception out of ``handle`` is logged and the key retried with backoff (the worker lives on)."""
    while True:
        key = queue.get()
        if key is None:
            return
        try:
            handle(key)
        except Exception as e:
            delay = queue.requeue(key)
            log.exception(
                "work item failed",
                extra={"queue": queue.name, "key": str(key), "err": repr(e), "retryInSeconds": delay},
            )
        finally:
            queue.done(key)


def start_workers(queue: WorkQueue[K], handle: Callable[[K], None], count: int = 1) -> list[threading.Thread]:
    """``count`` daemon threads running :func:`run_worker`."""
    threads = [
        threading.Thread(target=run_worker, args=(queue, handle), name=f"{queue.name}-{i}", daemon=True)
        for i in range(count)
    ]
    for t in threads:
        t.start()
    return threads
