"""The gRPC face of the orchestrator, its leader election loop and its HTTP /metrics, /readyz.

I/O boundary: a gRPC server (``rose.timeslice.v1.TimeSliceOrchestrator``, TCP), an HTTP server
(``/metrics``, ``/healthz``, ``/readyz``: 200 only on the active replica, so a Service sends
callers to it) and, through :class:`Elector`, the leader Lease. Requests are translated into
:class:`~timeslice.orchestrator.Orchestrator` calls and its errors into status codes:
INVALID_ARGUMENT (bad names), FAILED_PRECONDITION (a stale fencing token), DEADLINE_EXCEEDED,
UNAVAILABLE (not the leader, the store unreachable: retry), RESOURCE_EXHAUSTED (queue full),
ABORTED (a hand-over failed and was rolled back), UNAUTHENTICATED / PERMISSION_DENIED (with
authentication on, for every RPC: no or a refused ServiceAccount token, a job outside the token's
namespace, a group of another namespace, a job without worker pods in the group), NOT_FOUND (the
Status of a group nobody acquired: nothing is created for it).

Tenancy: a group's key is ``namespace/name``, the namespace being the job's (with authentication,
the caller's ServiceAccount namespace, which the job must be in); a job takes a place only after
its :class:`~timeslice.members.Members` source confirmed it, and its priority comes from there
(the job's pods' ``spec.priority``), clamped. Acquire calls in flight are capped per namespace and
in all, below the gRPC thread pool, so Yield, Renew and Status always find a thread. The server
speaks TLS (the certificate and key files are re-read when they change) unless it was built
insecure on purpose; the HTTP listener is the bounded :mod:`rose_common.httpserver` kernel.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from rose_common import httpserver, leader
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from timeslice import identity
from timeslice.identity import Flights, Forbidden, ReviewCache, Unauthenticated
from timeslice.members import Members, NotMember, RequestPriority, clamp
from timeslice.orchestrator import (
    Busy,
    Cancelled,
    DeadlineExceeded,
    HandoverFailed,
    NotLeader,
    Orchestrator,
    StoreContention,
)
from timeslice.state import Group, Refused, group_key, split_key, validate_label, validate_label_value, validate_name

log = logging.getLogger("timeslice")

# what ``role`` may be (a metric label): a fixed set, so a caller cannot mint label values
ROLES = frozenset(
    {"", "trainer", "sampler", "rollout", "learner", "actor", "critic", "reward", "reference", "evaluator"}
)
RESERVED_THREADS = 32  # gRPC threads no Acquire may take: Yield, Renew and Status always find one


class NotFound(Exception):
    """A group nobody acquired (Status)."""


@dataclass(frozen=True)
class Limits:
    """What one namespace, and all of them, may hold of the server."""

    max_acquires: int = 256  # Acquire calls in flight in all (waiting or being granted)
    max_acquires_per_namespace: int = 32  # ... per caller namespace
    max_priority: int = 100  # a job's priority is clamped to +- this many --aging periods
    member_cache_s: float = 5.0  # how long a job's membership (and priority) is trusted

    def __post_init__(self) -> None:
        if self.max_acquires < 1 or self.max_acquires_per_namespace < 1:
            raise ValueError("max-acquires and max-acquires-per-namespace must be >= 1")
        if self.max_priority < 0:
            raise ValueError(f"max-priority must be >= 0, got {self.max_priority}")


def _status(g: Group, now: float) -> pb.StatusResponse:
    waiters = [pb.Waiter(job=w.job, role=w.role, waited_s=max(0.0, now - w.since)) for w in g.waiters if w.live]
    return pb.StatusResponse(group=g.name, holder=g.holder, fencing_token=g.token, waiters=waiters, resident=g.resident)


@contextmanager
def _codes(context: grpc.ServicerContext) -> Iterator[None]:
    try:
        yield
    except ValueError as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    except Refused as e:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
    except NotFound as e:
        context.abort(grpc.StatusCode.NOT_FOUND, str(e))
    except (PermissionError, NotMember) as e:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
    except (DeadlineExceeded, Cancelled) as e:
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
    except Unauthenticated as e:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
    except Forbidden as e:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
    except Busy as e:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
    except HandoverFailed as e:
        context.abort(grpc.StatusCode.ABORTED, str(e))
    except (NotLeader, StoreContention) as e:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    except grpc.RpcError:
        raise
    except Exception as e:  # the store (API server) unreachable or refusing: the caller retries
        if type(e).__name__ == "_AbortError" or isinstance(e, AssertionError):
            raise
        log.warning("request failed", extra={"err": repr(e)})
        context.abort(grpc.StatusCode.UNAVAILABLE, f"orchestrator store error: {e!r}")


class Servicer(pb_grpc.TimeSliceOrchestratorServicer):
    def __init__(
        self,
        orch: Orchestrator,
        auth: ReviewCache | None = None,
        members: Members | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.orch = orch
        self.auth = auth
        self.limits = limits or Limits()
        self._raw_members: Members = members or RequestPriority()
        # a lookup that ignores the request's priority is cached per (namespace, job, group)
        self._members: Flights[tuple[str, str, str], int] = Flights(
            lambda k: self._raw_members.priority(*k, 0),
            time.monotonic,
            self.limits.member_cache_s,
            4096,
            keep=(NotMember,),
        )
        self._inflight: Counter[str] = Counter()
        self._mu = threading.Lock()

    # ------------------------------------------------------------------ who, which group
    def _caller_ns(self, context: grpc.ServicerContext) -> str | None:
        """The caller's namespace (authentication on), else None."""
        if self.auth is None:
            return None
        return self.auth.namespace(identity.bearer(context.invocation_metadata()))

    def _job(self, job: str, context: grpc.ServicerContext) -> str:
        """The job's namespace ("" for a plain name, only without authentication); refusals name the fix."""
        validate_name("job", job)
        caller = self._caller_ns(context)
        if caller is not None:
            identity.check_job(job, caller)
        ns, sep, name = job.partition("/")
        if not sep:
            return ""
        validate_label("job namespace", ns)
        validate_label_value("job name", name)
        return ns

    def _refused(self, ns: str, reason: str) -> None:
        self.orch.metrics.refusals.labels(ns or "-", reason).inc()

    @contextmanager
    def _slot(self, ns: str) -> Iterator[None]:
        """An Acquire in flight for namespace ``ns``: Busy beyond the per-namespace or the total cap."""
        lim = self.limits
        with self._mu:
            if self._inflight[ns] >= lim.max_acquires_per_namespace:
                self._refused(ns, "namespace-cap")
                raise Busy(
                    f"namespace {ns or '(none)'!r} has {lim.max_acquires_per_namespace} Acquire calls in flight"
                    " (--max-acquires-per-namespace): let some be granted or withdrawn, then retry"
                )
            if sum(self._inflight.values()) >= lim.max_acquires:
                self._refused(ns, "total-cap")
                raise Busy(f"the orchestrator has {lim.max_acquires} Acquire calls in flight (--max-acquires); retry")
            self._inflight[ns] += 1
        try:
            yield
        finally:
            with self._mu:
                self._inflight[ns] -= 1
                if self._inflight[ns] <= 0:
                    del self._inflight[ns]

    # ------------------------------------------------------------------ the RPCs
    def Acquire(self, request: pb.AcquireRequest, context: grpc.ServicerContext) -> pb.AcquireResponse:
        remaining = context.time_remaining()
        deadline = self.orch.clock() + remaining if remaining is not None else None
        with _codes(context):
            ns = self._job(request.job, context)
            if request.role not in ROLES:
                self._refused(ns, "role")
                raise ValueError(
                    f"role {request.role!r} is not one of {', '.join(sorted(r for r in ROLES if r))} (or empty)"
                )
            key = group_key(request.group, ns)
            with self._slot(ns):
                name, group = request.job.partition("/")[2] or request.job, split_key(key)[1]
                try:
                    if isinstance(self._raw_members, RequestPriority):  # explicit: the request's hint
                        prio = self._raw_members.priority(ns, name, group, request.priority)
                    else:
                        prio = self._members.get((ns, name, group))
                except NotMember:
                    self._refused(ns, "not-member")
                    raise
                context.add_callback(lambda: self.orch.wake(key))
                r = self.orch.acquire(
                    key,
                    request.job,
                    request.role,
                    clamp(prio, self.limits.max_priority),
                    deadline,
                    alive=context.is_active,
                )
            return pb.AcquireResponse(
                fencing_token=r.token,
                lease_ttl_s=r.lease_ttl_s,
                was_resident=r.was_resident,
                wait_s=r.wait_s,
                suspend_s=r.suspend_s,
                restore_s=r.restore_s,
                grant_overhead_s=r.grant_overhead_s,
            )
        raise AssertionError("unreachable")

    def Yield(self, request: pb.YieldRequest, context: grpc.ServicerContext) -> pb.YieldResponse:
        with _codes(context):
            ns = self._job(request.job, context)
            self.orch.yield_(group_key(request.group, ns), request.job, request.fencing_token)
        return pb.YieldResponse()

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> pb.RenewResponse:
        with _codes(context):
            ns = self._job(request.job, context)
            ttl = self.orch.renew(group_key(request.group, ns), request.job, request.fencing_token)
            return pb.RenewResponse(lease_ttl_s=ttl)
        raise AssertionError("unreachable")

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        return self._statuses(context, request.group)[0]

    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        return pb.ListGroupsResponse(groups=self._statuses(context, None))

    def _statuses(self, context: grpc.ServicerContext, group: str | None) -> list[pb.StatusResponse]:
        """Status of ``group`` (None: every group). With authentication on, a caller reads only its own
        namespace's groups (``group`` is resolved in it; another namespace's is PERMISSION_DENIED and
        ListGroups leaves them out). An unknown group is NOT_FOUND, and nothing is created for it."""
        with _codes(context):
            ns = self._caller_ns(context)
            self.orch.check_leader()
            now = self.orch.clock()
            if group is None:
                groups = [g for g in self.orch.groups() if ns is None or split_key(g.name)[0] == ns]
            else:
                key = group_key(group, ns if ns is not None else group.rpartition("/")[0])
                g = self.orch.status(key)
                if g is None:
                    raise NotFound(f"group {key} has no record: nobody has acquired it")
                groups = [g]
            return [_status(g, now) for g in groups]
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class Tls:
    """The server's certificate chain and key files (PEM), re-read when either changes."""

    cert: Path
    key: Path

    def _read(self) -> tuple[bytes, bytes]:
        return self.key.read_bytes(), self.cert.read_bytes()

    def credentials(self) -> grpc.ServerCredentials:
        try:
            first = self._read()
        except OSError as e:
            raise OSError(f"cannot read the TLS certificate or key ({e}): check --tls-cert and --tls-key") from None
        seen = [self._stamp()]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            stamp = self._stamp()
            if stamp == seen[0]:
                return None
            try:
                key, cert = self._read()
            except OSError:
                return None  # mid-rotation: keep the current pair
            seen[0] = stamp
            log.info("tls certificate reloaded", extra={"cert": str(self.cert)})
            return grpc.ssl_server_certificate_configuration([(key, cert)])

        initial = grpc.ssl_server_certificate_configuration([first])
        return grpc.dynamic_ssl_server_credentials(initial, fetch)  # type: ignore[arg-type]  # None: no change

    def _stamp(self) -> tuple[float, float]:
        try:
            return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        except OSError:
            return (0.0, 0.0)


def grpc_server(
    orch: Orchestrator,
    address: str,
    max_rpcs: int | None = None,
    auth: ReviewCache | None = None,
    members: Members | None = None,
    limits: Limits | None = None,
    tls: Tls | None = None,
) -> tuple[grpc.Server, int]:
    """A started gRPC server on ``address`` (``HOST:PORT``, port 0 = ephemeral) and its port; TLS with
    ``tls``, plaintext without (the caller decided: ``--insecure``). ``max_rpcs`` (default: the
    Acquire cap plus the reserved threads) sizes the thread pool and the concurrent-call limit."""
    limits = limits or Limits()
    if max_rpcs is None:
        max_rpcs = limits.max_acquires + RESERVED_THREADS
    cap = max(1, max_rpcs - min(RESERVED_THREADS, max(1, max_rpcs // 4)))  # threads for Yield / Renew / Status
    if limits.max_acquires > cap:
        per_ns = min(limits.max_acquires_per_namespace, cap)
        limits = dataclasses.replace(limits, max_acquires=cap, max_acquires_per_namespace=per_ns)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_rpcs, thread_name_prefix="ts-grpc"), maximum_concurrent_rpcs=max_rpcs
    )
    servicer = Servicer(orch, auth, members, limits)
    pb_grpc.add_TimeSliceOrchestratorServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}: choose a free port (--listen)")
    server.start()
    return server, port


# ---------------------------------------------------------------------- leader election


class Lock(Protocol):
    def get(self) -> tuple[leader.LeaseRecord | None, str]: ...
    def write(self, record: leader.LeaseRecord, resource_version: str) -> bool: ...


class Elector:
    """Holds the leader Lease; ``leading()`` is true only within a lease duration of the last renewal."""

    def __init__(
        self,
        lock: Lock | None,
        identity: str,
        duration_s: int,
        renew_s: float,
        on_change: Callable[[bool], None] = lambda lead: None,
    ) -> None:
        if lock is not None and renew_s >= duration_s:
            raise ValueError(f"lease-renew ({renew_s}s) must be shorter than lease-duration ({duration_s}s)")
        self.lock = lock
        self.identity = identity
        self.duration_s = duration_s
        self.renew_s = renew_s
        self.on_change = on_change
        self._valid_until = float("inf") if lock is None else 0.0

    def leading(self) -> bool:
        return time.monotonic() < self._valid_until

    def once(self) -> bool:
        if self.lock is None:
            return True
        was = self.leading()
        started = time.monotonic()
        try:
            record, rv = self.lock.get()
            d = leader.decide(record, self.identity, dt.datetime.now(dt.UTC), self.duration_s)
            lead = d.leader and (d.write is None or self.lock.write(d.write, rv))
            reason = d.reason
        except Exception as e:
            lead, reason = False, f"lease unreachable: {e!r}"
        # stop acting a renew interval before another replica may take the lease over
        self._valid_until = started + self.duration_s - self.renew_s if lead else 0.0
        if lead != was:
            log.info("leadership changed", extra={"leader": lead, "identity": self.identity, "reason": reason})
            self.on_change(lead)
        return lead

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.once()
            stop.wait(self.renew_s)


# ---------------------------------------------------------------------- HTTP


def http_server(orch: Orchestrator, address: tuple[str, int], timeout_s: float = 5.0) -> httpserver.BoundedServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` (200 only while this replica leads) on the
    :mod:`rose_common.httpserver` kernel, served in a thread: at most 16 connections (beyond, its
    overload rule), a request (or an idle keep-alive connection) holds one for ``timeout_s`` at most;
    refusals count in ``rose_timeslice_http_refused_total{reason}``."""

    def leading() -> tuple[bool, str]:
        lead = orch.leading()
        return lead, "leader" if lead else "standby"

    refused = httpserver.refusals_counter(orch.metrics.registry, "rose_timeslice_http_refused")
    routes = httpserver.Routes(
        httpserver.probe_routes(healthy=httpserver.always_ok, ready=leading, registry=orch.metrics.registry),
        on_refused=lambda reason: refused.labels(reason).inc(),
    )
    limits = httpserver.Limits(
        backlog=64, max_connections=16, idle_timeout=timeout_s, request_timeout=timeout_s, write_timeout=timeout_s
    )
    return httpserver.serve(address, routes, limits, name="timeslice")
