"""gRPC servicers of rose.agent.v1 and the servers that bind them to unix sockets.

* One workload socket per prepared claim (``<claim-socket-root>/<claimUID>/workload.sock``),
  opened by the driver at prepare time and mounted into the claim's containers through its CDI
  spec. A connection on it acts only for the pods of that claim (``ClaimScope``: the driver's
  claim records), whatever the request body says: identity comes from which socket the kernel
  connected, and only that claim's containers have it.
* The control socket (NodeControl), root only, in a 0700 directory no pod mounts.
* Optionally a shared, unscoped workload socket (the standalone agent, root only): registrations
  on it are capped and their reported sizes never count in the host budget, and they can neither
  take over a claim the driver bound nor get anyone evicted.

Every socket is bound inside a directory only this process can enter (0700), so it is never
connectable by others between bind and chmod, whatever the umask. I/O boundary: unix sockets
and their directories.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

from dra_driver.agent.convert import (
    ack_from_pb,
    command_to_pb,
    operation_to_pb,
    registration_from_pb,
    report_from_pb,
    workload_to_pb,
    world_command,
)
from dra_driver.agent.reports import ReportBook, ReportError
from dra_driver.claims import PodRef
from dra_driver.fencebook import FenceBook
from dra_driver.fencing import Verdict
from dra_driver.suspend.engine import NodeSuspendEngine, UnknownOccupantError
from dra_driver.suspend.model import Command
from dra_driver.suspend.registry import (
    ClaimScope,
    RegistrationError,
    RegistrationRefused,
    RegistryFull,
    TrustedPod,
    Workload,
)
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

log = logging.getLogger("rose.agent")

_STREAM_POLL_SECONDS = 0.2


class WorkloadAgentServicer(pb_grpc.WorkloadAgentServicer):
    """``scope``: the claim whose socket this servicer answers on (None: a shared socket);
    ``reports``: the node's workload reports and job worlds (pushed as ``COMMAND_KIND_WORLD``)."""

    def __init__(
        self, engine: NodeSuspendEngine, scope: ClaimScope | None = None, reports: ReportBook | None = None
    ) -> None:
        self._engine = engine
        self.scope = scope
        self.reports = reports if reports is not None else ReportBook()

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        scope = self.scope
        try:
            reg = registration_from_pb(request)
            w = self._engine.register(reg, scope)
        except RegistrationError as e:
            log.warning(
                "registration refused",
                extra={"podUID": request.pod_uid, "claim": scope.claim_uid if scope else "", "err": str(e)},
            )
            context.abort(_status_of(e), str(e))
        return pb.RegisterResponse(session_id=w.session_id, node_name=self._engine.config.node_name)

    def _session(self, pod_uid: str, session_id: str, context: grpc.ServicerContext) -> Workload:
        """The workload's live session, or FAILED_PRECONDITION saying to register (again)."""
        w = self._engine.session(pod_uid, session_id, self.scope)
        if w is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {pod_uid!r} has no registration with session {session_id!r} on this socket:"
                " call Register first (and again after an agent restart)",
            )
        return w

    def Commands(self, request: pb.CommandsRequest, context: grpc.ServicerContext) -> Iterator[pb.Command]:
        w = self._session(request.pod_uid, request.session_id, context)
        with w.cond:
            w.streams_open += 1
        sent = 0  # the world version this stream delivered last (0: none)
        try:
            while context.is_active():
                world, version = self.reports.world(request.pod_uid)
                if world is not None and version != sent:
                    sent = version
                    yield world_command(world)
                try:
                    cmd: Command | None = w.commands.get(timeout=_STREAM_POLL_SECONDS)
                except queue.Empty:
                    continue
                if cmd is None:  # superseded by a new registration, or forgotten
                    return
                yield command_to_pb(cmd)
        finally:
            with w.cond:
                w.streams_open -= 1

    def Acknowledge(self, request: pb.AcknowledgeRequest, context: grpc.ServicerContext) -> pb.AcknowledgeResponse:
        if not request.operation_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "operation_id is required (copy it from the Command)")
        accepted, msg = self._engine.acknowledge(request.pod_uid, request.session_id, ack_from_pb(request), self.scope)
        if not accepted:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
        return pb.AcknowledgeResponse(accepted=True, message=msg)

    def UpdateStateSize(
        self, request: pb.UpdateStateSizeRequest, context: grpc.ServicerContext
    ) -> pb.UpdateStateSizeResponse:
        try:
            accepted, msg = self._engine.update_state_bytes(
                request.pod_uid, request.session_id, request.state_bytes, self.scope
            )
        except RegistrationError as e:
            context.abort(_status_of(e), str(e))
        if not accepted:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
        return pb.UpdateStateSizeResponse(accepted=True)

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        w = self._session(request.pod_uid, request.session_id, context)
        try:
            report = report_from_pb(request)
            if report.state_bytes > 0:
                self._engine.update_state_bytes(request.pod_uid, request.session_id, report.state_bytes, self.scope)
        except ReportError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RegistrationError as e:
            context.abort(_status_of(e), str(e))
        world = self.reports.report(PodRef(w.reg.pod_namespace, w.reg.pod_name, w.pod_uid), report)
        return pb.ReportResponse(
            accepted=True, world_active=world.active if world else 0, world_total=world.total if world else 0
        )


def _status_of(e: RegistrationError) -> grpc.StatusCode:
    if isinstance(e, RegistryFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(e, RegistrationRefused):
        return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.INVALID_ARGUMENT


class NodeControlServicer(pb_grpc.NodeControlServicer):
    def __init__(self, engine: NodeSuspendEngine) -> None:
        self._engine = engine
        # Judges a request's fencing token; the driver wires in its checkpointed NodeDriver.admit_fence.
        self.fence: Callable[[str], Verdict] = FenceBook().admit

    def _fenced(self, raw: str, context: grpc.ServicerContext) -> None:
        if not raw:
            return
        try:
            verdict = self.fence(raw)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if not verdict.ok:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, verdict.message())

    def Suspend(self, request: pb.SuspendRequest, context: grpc.ServicerContext) -> pb.Operation:
        if not request.pod_uid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod_uid is required")
        self._fenced(request.fencing_token, context)
        g = request.grace_seconds
        if not math.isfinite(g) or g < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grace_seconds must be a finite number >= 0, got {g}")
        try:
            rec = self._engine.suspend_pod(request.pod_uid, g, request.reason, wait=not request.no_wait)
        except UnknownOccupantError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return operation_to_pb(rec)

    def Resume(self, request: pb.ResumeRequest, context: grpc.ServicerContext) -> pb.Operation:
        if not request.pod_uid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod_uid is required")
        self._fenced(request.fencing_token, context)
        try:
            rec = self._engine.resume_pod(request.pod_uid, wait=not request.no_wait)
        except UnknownOccupantError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return operation_to_pb(rec)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        ws = [w for w in self._engine.registry.all() if not request.pod_uid or w.pod_uid == request.pod_uid]
        if request.pod_uid and not ws:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no workload with pod UID {request.pod_uid!r} on this node")
        ops = self._engine.operations(request.pod_uid)[-64:]
        return pb.StatusResponse(
            workloads=[workload_to_pb(w) for w in ws],
            host_budget_bytes=self._engine.budget.capacity_bytes,
            host_bytes_held=self._engine.budget.held_bytes(),
            recent_operations=[operation_to_pb(r) for r in ops],
        )

    def GetOperation(self, request: pb.GetOperationRequest, context: grpc.ServicerContext) -> pb.Operation:
        rec = self._engine.operation(request.operation_id)
        if rec is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no operation {request.operation_id!r} (this agent keeps the last 1024 operations)",
            )
        return operation_to_pb(rec)


def private_dir(path: Path) -> None:
    """Make ``path`` a directory only this user can enter (0700), creating it when missing.

    Refuses a shared directory (sticky, like /tmp, or owned by someone else) rather than chmod it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_mode & stat.S_ISVTX or st.st_uid != os.geteuid():
        raise OSError(f"{path} is a shared directory: put the agent's sockets in a directory of their own")
    os.chmod(path, 0o700)


def _prepare_socket_path(path: Path) -> None:
    private_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run


def _bind(server: grpc.Server, path: Path) -> None:
    _prepare_socket_path(path)
    if server.add_insecure_port(f"unix:{path}") == 0:
        raise OSError(f"cannot bind unix socket {path} (path too long or directory not writable?)")


CLAIM_SOCKET_NAME = "workload.sock"


class ClaimSockets:
    """One WorkloadAgent server per prepared claim, under ``root`` (0700 on the host).

    The claim's directory is 0711 and its socket 0666 once bound: any user inside the claim's
    containers (where the CDI spec mounts that directory) may connect; on the host only root
    reaches it, since ``root`` is 0700."""

    def __init__(
        self, engine: NodeSuspendEngine, root: Path, *, workers_per_claim: int = 4, reports: ReportBook | None = None
    ) -> None:
        self.engine = engine
        self.root = root
        self.reports = reports if reports is not None else ReportBook()
        self._workers = workers_per_claim
        self._mu = threading.Lock()
        self._open: dict[str, tuple[grpc.Server, WorkloadAgentServicer]] = {}

    def socket_dir(self, claim_uid: str) -> Path:
        if not claim_uid or "/" in claim_uid or claim_uid in (".", ".."):
            raise ValueError(f"claim UID {claim_uid!r} cannot name a socket directory")
        return self.root / claim_uid

    def open(self, scope: ClaimScope) -> Path:
        """Serve ``scope``'s claim on its own socket (idempotent: a reopen updates the scope)."""
        d = self.socket_dir(scope.claim_uid)
        sock = d / CLAIM_SOCKET_NAME
        with self._mu:
            cur = self._open.get(scope.claim_uid)
            if cur is not None:
                cur[1].scope = scope
                return sock
            private_dir(self.root)
            servicer = WorkloadAgentServicer(self.engine, scope, self.reports)
            pool = futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="rose-claim")
            server = grpc.server(pool)
            pb_grpc.add_WorkloadAgentServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
            _bind(server, sock)
            server.start()
            os.chmod(sock, 0o666)
            os.chmod(d, 0o711)
            self._open[scope.claim_uid] = (server, servicer)
        log.info("claim socket serving", extra={"claim": scope.claim_uid, "socket": str(sock)})
        return sock

    def open_claim(self, claim_uid: str, pods: list[PodRef], max_state_bytes: int) -> Path:
        """``dra_driver.node.WorkloadSockets``: open the claim's socket for ``pods``; its directory."""
        scope = ClaimScope(claim_uid, tuple(TrustedPod(p.namespace, p.name, p.uid) for p in pods), max_state_bytes)
        return self.open(scope).parent

    def close_claim(self, claim_uid: str) -> None:
        self.close(claim_uid)

    def close(self, claim_uid: str, grace: float | None = 0.5) -> bool:
        with self._mu:
            cur = self._open.pop(claim_uid, None)
        d = self.socket_dir(claim_uid)
        if cur is not None:
            for w in self.engine.registry.all():
                if w.scope is not None and w.scope.claim_uid == claim_uid:
                    w.commands.put(None)
            cur[0].stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            (d / CLAIM_SOCKET_NAME).unlink()
        with contextlib.suppress(FileNotFoundError, OSError):
            d.rmdir()
        return cur is not None

    def claims(self) -> list[str]:
        with self._mu:
            return sorted(self._open)

    def close_all(self) -> None:
        for c in self.claims():
            self.close(c, 0)


class AgentServer:
    """NodeControl on the control socket, WorkloadAgent per claim (``claims``) and optionally on a
    shared socket; every socket bound in a 0700 directory, then chmod."""

    def __init__(
        self,
        engine: NodeSuspendEngine,
        workload_socket: Path | None,
        control_socket: Path,
        *,
        claim_socket_root: Path | None = None,
        max_workers: int = 64,
        reports: ReportBook | None = None,
    ) -> None:
        self.engine = engine
        self.workload_socket = workload_socket
        self.control_socket = control_socket
        self.reports = reports if reports is not None else ReportBook()
        root = claim_socket_root if claim_socket_root is not None else control_socket.parent / "claims"
        self.claims = ClaimSockets(engine, root, reports=self.reports)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rose-agent"))
        self.control = NodeControlServicer(engine)
        pb_grpc.add_NodeControlServicer_to_server(self.control, self._server)  # type: ignore[no-untyped-call]
        _bind(self._server, control_socket)
        self._shared: grpc.Server | None = None
        if workload_socket is not None:
            self._shared = grpc.server(
                futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rose-agent-w")
            )
            pb_grpc.add_WorkloadAgentServicer_to_server(WorkloadAgentServicer(engine, None, self.reports), self._shared)  # type: ignore[no-untyped-call]
            _bind(self._shared, workload_socket)

    def _sockets(self) -> list[Path]:
        return [p for p in (self.workload_socket, self.control_socket) if p is not None]

    def start(self) -> None:
        self._server.start()
        self.reports.start()
        if self._shared is not None:
            self._shared.start()
        for p in self._sockets():
            os.chmod(p, 0o600)
        log.info(
            "agent serving",
            extra={
                "workloadSocket": str(self.workload_socket or ""),
                "controlSocket": str(self.control_socket),
                "claimSocketRoot": str(self.claims.root),
            },
        )

    def stop(self, grace: float | None = 1.0) -> None:
        # End command streams so the stop does not wait on them.
        for w in self.engine.registry.all():
            w.commands.put(None)
        self.reports.stop()
        self.claims.close_all()
        if self._shared is not None:
            self._shared.stop(grace).wait()
        self._server.stop(grace).wait()
        for p in self._sockets():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def wait(self) -> None:
        self._server.wait_for_termination()
