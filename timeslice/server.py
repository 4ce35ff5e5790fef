"""The gRPC face of the orchestrator, its leader election loop and its HTTP /metrics, /readyz.

I/O boundary: a gRPC server (``rose.timeslice.v1.TimeSliceOrchestrator``, TCP), an HTTP server
(``/metrics``, ``/healthz``, ``/readyz``: 200 only on the active replica, so a Service sends
callers to it) and, through :class:`Elector`, the leader Lease. Requests are translated into
:class:`~timeslice.orchestrator.Orchestrator` calls and its errors into status codes:
INVALID_ARGUMENT (bad names), FAILED_PRECONDITION (a stale fencing token), DEADLINE_EXCEEDED,
UNAVAILABLE (not the leader, the store unreachable: retry), RESOURCE_EXHAUSTED (queue full),
ABORTED (a hand-over failed and was rolled back), UNAUTHENTICATED / PERMISSION_DENIED (with
authentication on, for every RPC: no or a refused ServiceAccount token, a job outside the token's
namespace, the Status of a group none of the namespace's jobs is in).
Connections are bounded by ``maximum_concurrent_rpcs``.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rose_common import leader
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from timeslice import identity
from timeslice.identity import Forbidden, ReviewCache, Unauthenticated
from timeslice.orchestrator import (
    Busy,
    Cancelled,
    DeadlineExceeded,
    HandoverFailed,
    NotLeader,
    Orchestrator,
    StoreContention,
)
from timeslice.state import Group, Refused

log = logging.getLogger("timeslice")


def _status(g: Group, now: float) -> pb.StatusResponse:
    waiters = [pb.Waiter(job=w.job, role=w.role, waited_s=max(0.0, now - w.since)) for w in g.waiters if w.live]
    return pb.StatusResponse(group=g.name, holder=g.holder, fencing_token=g.token, waiters=waiters,
                             resident=g.resident)  # fmt: skip


def _jobs(g: Group) -> list[str]:
    """The jobs in a group: its holder, its resident and its waiters."""
    return [j for j in (g.holder, g.resident, *(w.job for w in g.waiters)) if j]


@contextmanager
def _codes(context: grpc.ServicerContext) -> Iterator[None]:
    try:
        yield
    except ValueError as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    except Refused as e:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
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
    def __init__(self, orch: Orchestrator, auth: ReviewCache | None = None) -> None:
        self.orch = orch
        self.auth = auth

    def _caller(self, job: str, context: grpc.ServicerContext) -> None:
        """With authentication on: the caller's ServiceAccount namespace must be the job's."""
        if self.auth is not None:
            identity.check_job(job, self.auth.namespace(identity.bearer(context.invocation_metadata())))

    def Acquire(self, request: pb.AcquireRequest, context: grpc.ServicerContext) -> pb.AcquireResponse:
        remaining = context.time_remaining()
        deadline = self.orch.clock() + remaining if remaining is not None else None
        context.add_callback(lambda: self.orch.wake(request.group))
        with _codes(context):
            self._caller(request.job, context)
            r = self.orch.acquire(request.group, request.job, request.role, request.priority, deadline,
                                  alive=context.is_active)  # fmt: skip
            return pb.AcquireResponse(fencing_token=r.token, lease_ttl_s=r.lease_ttl_s, was_resident=r.was_resident,
                                      wait_s=r.wait_s, suspend_s=r.suspend_s, restore_s=r.restore_s,
                                      grant_overhead_s=r.grant_overhead_s)  # fmt: skip
        raise AssertionError("unreachable")

    def Yield(self, request: pb.YieldRequest, context: grpc.ServicerContext) -> pb.YieldResponse:
        with _codes(context):
            self._caller(request.job, context)
            self.orch.yield_(request.group, request.job, request.fencing_token)
        return pb.YieldResponse()

    def Renew(self, request: pb.RenewRequest, context: grpc.ServicerContext) -> pb.RenewResponse:
        with _codes(context):
            self._caller(request.job, context)
            return pb.RenewResponse(lease_ttl_s=self.orch.renew(request.group, request.job, request.fencing_token))
        raise AssertionError("unreachable")

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        return self._statuses(context, request.group)[0]

    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        return pb.ListGroupsResponse(groups=self._statuses(context, None))

    def _statuses(self, context: grpc.ServicerContext, group: str | None) -> list[pb.StatusResponse]:
        """Status of ``group`` (None: every group). With authentication on, a caller reads only the
        groups one of its namespace's jobs is in; another group's Status is PERMISSION_DENIED, and
        ListGroups leaves it out."""
        with _codes(context):
            ns = self.auth.namespace(identity.bearer(context.invocation_metadata())) if self.auth else None
            self.orch.check_leader()
            now = self.orch.clock()
            groups = [self.orch.status(group)] if group is not None else self.orch.groups()
            if ns is not None and group is not None:
                identity.check_member(group, _jobs(groups[0]), ns)
            return [_status(g, now) for g in groups if ns is None or identity.member(_jobs(g), ns)]
        raise AssertionError("unreachable")


def grpc_server(orch: Orchestrator, address: str, max_rpcs: int,
                auth: ReviewCache | None = None) -> tuple[grpc.Server, int]:  # fmt: skip
    """A started gRPC server on ``address`` (``HOST:PORT``, port 0 = ephemeral) and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_rpcs, thread_name_prefix="ts-grpc"),
                         maximum_concurrent_rpcs=max_rpcs)  # fmt: skip
    pb_grpc.add_TimeSliceOrchestratorServicer_to_server(Servicer(orch, auth), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(address)
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

    def __init__(self, lock: Lock | None, identity: str, duration_s: int, renew_s: float,
                 on_change: Callable[[bool], None] = lambda lead: None) -> None:  # fmt: skip
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


def http_server(orch: Orchestrator, address: tuple[str, int]) -> ThreadingHTTPServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` (200 only while this replica leads), served in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(orch.metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif self.path == "/readyz":
                lead = orch.leading()
                self._send(200 if lead else 503, b"leader\n" if lead else b"standby\n", "text/plain")
            else:
                self._send(404, b"not found: use /metrics, /healthz or /readyz\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(address, Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="ts-http", daemon=True).start()
    return srv
