"""Who is calling: a ServiceAccount token's namespace must be the job's namespace.

I/O boundary: none. The caller sends its pod's projected ServiceAccount token as gRPC metadata
``authorization: Bearer <token>``; a reviewer (``timeslice.kube.TokenReviewer``: a TokenReview
in the API server) maps it to a username. :func:`namespace_of` reads the ServiceAccount's
namespace from ``system:serviceaccount:<ns>:<name>``; :func:`check_job` refuses a job
(``namespace/name``) outside it; :func:`member` and :func:`check_member` let a caller read only
the groups one of its namespace's jobs is in (holding, resident or waiting). :class:`ReviewCache`
keeps verdicts for a short time so a grant does not wait for a TokenReview each phase.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

SA_PREFIX = "system:serviceaccount:"


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


class ReviewCache:
    """token → namespace verdicts (and refusals) for ``ttl_s``, at most ``size`` entries."""

    def __init__(self, review: Callable[[str], str], clock: Callable[[], float], ttl_s: float = 60.0,
                 size: int = 1024) -> None:  # fmt: skip
        self.review = review
        self.clock = clock
        self.ttl_s = ttl_s
        self.size = size
        self._hits: OrderedDict[str, tuple[float, str | Unauthenticated]] = OrderedDict()
        self._lock = threading.Lock()

    def namespace(self, token: str) -> str:
        with self._lock:
            return self._namespace(token)

    def _namespace(self, token: str) -> str:
        now = self.clock()
        hit = self._hits.get(token)
        if hit is None or hit[0] < now:
            try:
                verdict: str | Unauthenticated = namespace_of(self.review(token))
            except Unauthenticated as e:
                verdict = e
            hit = (now + self.ttl_s, verdict)
            self._hits[token] = hit
            while len(self._hits) > self.size:
                self._hits.popitem(last=False)
        if isinstance(hit[1], Unauthenticated):
            raise hit[1]
        return hit[1]
