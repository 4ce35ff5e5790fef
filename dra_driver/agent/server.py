"""gRPC servicers of rose.agent.v1 and the server that binds them to unix sockets (mode 0600)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc

from dra_driver.agent.convert import (
    ack_from_pb,
    command_to_pb,
    operation_to_pb,
    registration_from_pb,
    workload_to_pb,
)
from dra_driver.suspend.engine import NodeSuspendEngine, UnknownOccupantError
from dra_driver.suspend.model import Command
from dra_driver.suspend.registry import RegistrationError
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc

log = logging.getLogger("rose.agent")

_STREAM_POLL_SECONDS = 0.2


class WorkloadAgentServicer(pb_grpc.WorkloadAgentServicer):
    def __init__(self, engine: NodeSuspendEngine) -> None:
        self._engine = engine

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        try:
            reg = registration_from_pb(request)
            w = self._engine.register(reg)
        except RegistrationError as e:
            log.warning("registration refused", extra={"podUID": request.pod_uid, "err": str(e)})
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.RegisterResponse(session_id=w.session_id, node_name=self._engine.config.node_name)

    def Commands(self, request: pb.CommandsRequest, context: grpc.ServicerContext) -> Iterator[pb.Command]:
        w = self._engine.registry.session(request.pod_uid, request.session_id)
        if w is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pod {request.pod_uid!r} has no registration with session {request.session_id!r}:"
                " call Register first (and again after an agent restart)",
            )
        with w.cond:
            w.streams_open += 1
        try:
            while context.is_active():
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
        accepted, msg = self._engine.acknowledge(request.pod_uid, request.session_id, ack_from_pb(request))
        if not accepted:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
        return pb.AcknowledgeResponse(accepted=True, message=msg)

    def UpdateStateSize(
        self, request: pb.UpdateStateSizeRequest, context: grpc.ServicerContext
    ) -> pb.UpdateStateSizeResponse:
        try:
            accepted, msg = self._engine.update_state_bytes(request.pod_uid, request.session_id, request.state_bytes)
        except RegistrationError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if not accepted:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, msg)
        return pb.UpdateStateSizeResponse(accepted=True)


class NodeControlServicer(pb_grpc.NodeControlServicer):
    def __init__(self, engine: NodeSuspendEngine) -> None:
        self._engine = engine

    def Suspend(self, request: pb.SuspendRequest, context: grpc.ServicerContext) -> pb.Operation:
        if not request.pod_uid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pod_uid is required")
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


def _prepare_socket_path(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run


class AgentServer:
    """Both services, each on its own unix socket, chmod 0600 once bound."""

    def __init__(
        self,
        engine: NodeSuspendEngine,
        workload_socket: Path,
        control_socket: Path,
        *,
        max_workers: int = 64,
    ) -> None:
        self.engine = engine
        self.workload_socket = workload_socket
        self.control_socket = control_socket
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rose-agent"))
        pb_grpc.add_WorkloadAgentServicer_to_server(WorkloadAgentServicer(engine), self._server)  # type: ignore[no-untyped-call]
        pb_grpc.add_NodeControlServicer_to_server(NodeControlServicer(engine), self._server)  # type: ignore[no-untyped-call]
        for p in (workload_socket, control_socket):
            _prepare_socket_path(p)
            if self._server.add_insecure_port(f"unix:{p}") == 0:
                raise OSError(f"cannot bind unix socket {p} (path too long or directory not writable?)")

    def start(self) -> None:
        self._server.start()
        for p in (self.workload_socket, self.control_socket):
            os.chmod(p, 0o600)
        log.info(
            "agent serving",
            extra={"workloadSocket": str(self.workload_socket), "controlSocket": str(self.control_socket)},
        )

    def stop(self, grace: float | None = 1.0) -> None:
        # End command streams so the stop does not wait on them.
        for w in self.engine.registry.all():
            w.commands.put(None)
        self._server.stop(grace).wait()
        for p in (self.workload_socket, self.control_socket):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def wait(self) -> None:
        self._server.wait_for_termination()
