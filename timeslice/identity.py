"""Who is calling: a ServiceAccount token's namespace must be the job's namespace.

I/O boundary: none. The caller sends its pod's projected ServiceAccount token as gRPC metadata
``authorization: Bearer <token>``; a reviewer (``timeslice.kube.TokenReviewer``: a TokenReview
in the API server) maps it to a username. :func:`namespace_of` reads the ServiceAccount's
namespace from ``system:serviceaccount:<ns>:<name>``; :func:`check_job` refuses a job
(``namespace/name``) outside it; :func:`member` and :func:`check_member` let a caller read only
the groups one of its namespace's jobs is in (holding, resident or waiting). :class:`ReviewCache`
keeps verdicts for a short time so a grant does not wait for a TokenReview each phase, with one
review per token in flight and no lock held across a review (a slow review of one token never
holds up a cached lookup of another).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

SA_PREFIX = "system:serviceaccount:"
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Unauthenticated(Exception):
    """No token, or one the API server does not accept."""


class Forbidden(Exception):
    """An authenticated caller naming a job outside its namespace."""


def bearer(metadata: Sequence[tuple[str, str | bytes]]) -> str:
    """The token of ``authorization: Bearer <token>``; Unauthenticated when absent."""
    for key, value in metadata:
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    raise Unauthenticated("no 'authorization: Bearer <token>' metadata: send the pod's projected ServiceAccount token")


def namespace_of(username: str) -> str:
    if not username.startswith(SA_PREFIX) or username.count(":") != 3:
        raise Unauthenticated(f"{username!r} is not a ServiceAccount: use a pod's ServiceAccount token")
    return username.split(":")[2]


def check_job(job: str, namespace: str) -> None:
    ns, sep, name = job.partition("/")
    if not sep or not name:
        raise Forbidden(f"job {job!r} must be 'namespace/name' when callers are authenticated")
    if ns != namespace:
        raise Forbidden(f"job {job!r} is outside the caller's namespace {namespace!r}")


def member(jobs: Iterable[str], namespace: str) -> bool:
    """Whether one of ``jobs`` (``namespace/name``) is in ``namespace``."""
    return any(j.partition("/")[0] == namespace and "/" in j for j in jobs)


def check_member(group: str, jobs: Iterable[str], namespace: str) -> None:
    if not member(jobs, namespace):
        raise Forbidden(
            f"group {group!r} has no job of the caller's namespace {namespace!r} (holding, resident or waiting):"
            " a caller reads only the groups its namespace's jobs are in"
        )


class Flights(Generic[K, V]):
    """A TTL cache of ``compute(key)`` results (and of the errors in ``keep``), at most ``size`` entries,
    with one computation per key at a time (single flight): callers of the same key wait for the one
    computing it, callers of other keys never wait for it (no lock is held while computing)."""

    def __init__(
        self,
        compute: Callable[[K], V],
        clock: Callable[[], float],
        ttl_s: float,
        size: int,
        keep: tuple[type[Exception], ...] = (),
    ) -> None:
        self.compute = compute
        self.clock = clock
        self.ttl_s = ttl_s
        self.size = size
        self.keep = keep
        self._hits: OrderedDict[K, tuple[float, V | Exception]] = OrderedDict()
        self._flights: dict[K, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> V:
        while True:
            with self._lock:
                hit = self._hits.get(key)
                if hit is not None and hit[0] >= self.clock():
                    return self._answer(hit[1])
                flight = self._flights.get(key)
                if flight is None:
                    flight = self._flights[key] = threading.Event()
                    break
            flight.wait()  # another caller computes this key; then read its verdict
        try:
            try:
                verdict: V | Exception = self.compute(key)
            except self.keep as e:
                verdict = e
            with self._lock:
                self._hits[key] = (self.clock() + self.ttl_s, verdict)
                self._hits.move_to_end(key)
                while len(self._hits) > self.size:
                    self._hits.popitem(last=False)
        finally:
            with self._lock:
                del self._flights[key]
            flight.set()
        return self._answer(verdict)

    @staticmethod
    def _answer(verdict: V | Exception) -> V:
        if isinstance(verdict, Exception):
            raise verdict
        return verdict


class ReviewCache:
    """token → namespace verdicts (and refusals) for ``ttl_s``, at most ``size`` entries; a TokenReview
    per token at a time, and none holds up a lookup of another token (:class:`Flights`)."""

    def __init__(
        self, review: Callable[[str], str], clock: Callable[[], float], ttl_s: float = 60.0, size: int = 1024
    ) -> None:
        self.review = review
        self._flights: Flights[str, str] = Flights(
            lambda t: namespace_of(self.review(t)), clock, ttl_s, size, keep=(Unauthenticated,)
        )

    def namespace(self, token: str) -> str:
        return self._flights.get(token)
