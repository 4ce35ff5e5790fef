"""The time-slice client: a job acquires a group of accelerators for a phase and yields it after.

I/O boundary: gRPC to the orchestrator (``rose.timeslice.v1.TimeSliceOrchestrator``, port 50051),
and, when an offloader is given, the job's own tensors (:class:`rose_sdk.offload.CooperativeOffloader`).

    orchestrator = TimeSliceOrchestratorClient(target="orchestrator:50051")

    @orchestrator.on_accelerators(group_id="trainer-group")
    def train_phase(model, trajectories): ...

``on_accelerators`` is a decorator and a context manager: acquire on entry (blocking until granted
or ``timeout_s``), yield on exit. While a group is held a background thread renews its lease.
Calls that meet ``UNAVAILABLE`` (an orchestrator restarting, a replica handing over leadership)
are retried with exponential backoff until ``retry_timeout_s``. Against an orchestrator run with
``--authenticate tokenreview`` the client sends ``authorization: Bearer`` with the projected
ServiceAccount token at ``token_file`` (default ``$ROSE_TIMESLICE_TOKEN_FILE``, which the controller
sets and mounts, audience ``rose-timeslice``, on the workers of a job with ``spec.timesliceGroup``).

The channel is TLS: the server's certificate is verified against the CA file ``ca_file`` (default
``$ROSE_TIMESLICE_CA_FILE``; without one, the system's roots), for the target's host name or
``server_name`` (``$ROSE_TIMESLICE_SERVER_NAME``). ``insecure=True`` (or
``ROSE_TIMESLICE_INSECURE=1``) is plaintext, only for an orchestrator run with ``--insecure``.

Where the device state moves: on Kubernetes the orchestrator's hand-over suspends the job through
its node's driver and agent (the job's :class:`rose_sdk.Workload` offloads at its safe point). Out
of Kubernetes (CPU jobs, the orchestrator's ``NoopHandover``) pass ``offloader=``: the client then
offloads the job's device tensors to host memory before every yield and restores them after every
acquire, so whatever the next job writes on the device cannot touch this job's state.

A phase too short to be worth a switch raises :class:`PhaseTooShortError` at the next entry, with
the measured switch cost (suspend + restore + grant overhead, and the local offload) and the
measured phase length; hold the group across several phases instead, or pass ``min_phase_ratio=0``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from rose_common import names
from rose_common.proto import rose_timeslice_v1_pb2 as pb
from rose_common.proto import rose_timeslice_v1_pb2_grpc as pb_grpc
from rose_sdk.offload import CooperativeOffloader

log = logging.getLogger("rose_sdk.timeslice")
T = TypeVar("T")

DEFAULT_PORT = 50051
ENV_JOB = names.ENV_TIMESLICE_JOB  # set by the controller on the workers of a job with spec.timesliceGroup
ENV_TOKEN_FILE = names.ENV_TIMESLICE_TOKEN_FILE  # the projected ServiceAccount token the controller mounts
ENV_CA_FILE = "ROSE_TIMESLICE_CA_FILE"  # PEM CA that signed the orchestrator's certificate
ENV_SERVER_NAME = "ROSE_TIMESLICE_SERVER_NAME"  # the name its certificate is for, when not the target's host
ENV_INSECURE = "ROSE_TIMESLICE_INSECURE"  # "1": plaintext, for an orchestrator run with --insecure


class TimeSliceError(RuntimeError):
    """The orchestrator refused or could not be reached; the message says what happened."""


class LeaseLostError(TimeSliceError):
    """The group was taken from this job (its lease expired or a newer hand-over fenced it)."""


class PhaseTooShortError(TimeSliceError):
    """The group's phases are shorter than a switch costs: time-slicing them loses time."""


@dataclass(frozen=True)
class Grant:
    group: str
    token: int
    lease_ttl_s: float
    was_resident: bool
    wait_s: float
    switch_s: float  # suspend + restore + grant overhead, plus the local restore (0 when resident)
    suspend_s: float = 0.0
    restore_s: float = 0.0
    grant_overhead_s: float = 0.0


@dataclass
class _Holding:
    grant: Grant
    entered: float
    stop: threading.Event = field(default_factory=threading.Event)
    lost: str = ""
    depth: int = 1
    renewer: threading.Thread | None = None


@dataclass
class _GroupTimes:
    phase_s: float | None = None  # the last phase's length
    switch_s: float | None = None  # the last switch's cost


def too_short(phase_s: float | None, switch_s: float | None, ratio: float) -> bool:
    """Whether a phase of ``phase_s`` is too short to be worth a switch costing ``switch_s``."""
    return ratio > 0 and phase_s is not None and switch_s is not None and switch_s > 0 and phase_s < ratio * switch_s


def backoff_delays(first_s: float, max_s: float) -> Callable[[int], float]:
    return lambda attempt: min(max_s, first_s * (2**attempt))


class TimeSliceOrchestratorClient:
    def __init__(
        self,
        target: str,
        job: str | None = None,
        *,
        role: str = "",
        offloader: CooperativeOffloader | None = None,
        min_phase_ratio: float = 1.0,
        retry_timeout_s: float = 60.0,
        backoff_first_s: float = 0.05,
        backoff_max_s: float = 2.0,
        channel: grpc.Channel | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        server_name: str | None = None,
        insecure: bool | None = None,
    ) -> None:
        if ":" not in target.rsplit("]", 1)[-1]:
            target = f"{target}:{DEFAULT_PORT}"
        self.target = target
        self.job = job or os.environ.get(ENV_JOB) or f"{socket.gethostname()}-{os.getpid()}"
        self.role = role
        # identity for an orchestrator run with --authenticate tokenreview: the pod's projected
        # ServiceAccount token, re-read at every call (the kubelet rotates it)
        self.token_file = token_file if token_file is not None else os.environ.get(ENV_TOKEN_FILE)
        self.offloader = offloader
        if min_phase_ratio < 0:
            raise ValueError(f"min_phase_ratio must be >= 0, got {min_phase_ratio}")
        self.min_phase_ratio = min_phase_ratio
        self.retry_timeout_s = retry_timeout_s
        self._delay = backoff_delays(backoff_first_s, backoff_max_s)
        self._channel = channel or _channel(target, ca_file, server_name, insecure)
        self._stub = pb_grpc.TimeSliceOrchestratorStub(self._channel)  # type: ignore[no-untyped-call]
        self._mu = threading.Lock()
        self._held: dict[str, _Holding] = {}
        self._times: dict[str, _GroupTimes] = {}
        self.grants: list[Grant] = []  # every grant, for the job's own metrics

    # ------------------------------------------------------------------ transport
    def _call(self, what: str, fn: Callable[..., T], request: Any, deadline: float | None) -> T:
        """``fn(request)`` with ``deadline`` (monotonic; None: the call's own default). UNAVAILABLE
        is retried with backoff while it lasts less than ``retry_timeout_s`` (and before
        ``deadline``); other errors become :class:`TimeSliceError` with the server's words."""
        attempt, since = 0, time.monotonic()
        while True:
            left = deadline - time.monotonic() if deadline is not None else None
            try:
                return fn(request, timeout=left, metadata=self._metadata())
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
                pause = self._delay(attempt)
                retry_end = min(since + self.retry_timeout_s, deadline if deadline is not None else float("inf"))
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() + pause < retry_end:
                    log.info("orchestrator unavailable, retrying", extra={"call": what, "attempt": attempt})
                    time.sleep(pause)
                    attempt += 1
                    continue
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    raise LeaseLostError(f"{what} refused by the orchestrator at {self.target}: {details}") from None
                raise TimeSliceError(f"{what} failed at {self.target}: {code.name}: {details}") from None

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """``authorization: Bearer <token>`` when a token file is set; nothing otherwise."""
        if not self.token_file:
            return ()
        try:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise TimeSliceError(
                f"cannot read the ServiceAccount token {self.token_file} ({ENV_TOKEN_FILE}): {e.strerror}"
            ) from None
        return (("authorization", f"Bearer {token}"),)

    def _short(self) -> float:
        """The deadline of a call that returns at once (Yield, Renew, Status)."""
        return time.monotonic() + self.retry_timeout_s

    # ------------------------------------------------------------------ acquire / yield
    def acquire(self, group: str, *, timeout_s: float | None = None, expected_phase_s: float = 0.0) -> Grant:
        """Block until this job holds ``group``; restores offloaded state. Re-entrant per group."""
        with self._mu:
            held = self._held.get(group)
            if held is not None:
                held.depth += 1
                return held.grant
        self._check_phase(group, expected_phase_s)
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        req = pb.AcquireRequest(group=group, job=self.job, role=self.role, expected_phase_s=expected_phase_s)
        r: pb.AcquireResponse = self._call(
            f"Acquire of group {group!r} by {self.job!r}", self._stub.Acquire, req, deadline
        )
        local_s = 0.0
        if self.offloader is not None and self.offloader.offloaded:
            local_s = self.offloader.restore().seconds
        switch_s = 0.0 if r.was_resident else r.suspend_s + r.restore_s + r.grant_overhead_s + local_s
        grant = Grant(
            group,
            r.fencing_token,
            r.lease_ttl_s,
            r.was_resident,
            r.wait_s,
            switch_s,
            r.suspend_s,
            r.restore_s,
            r.grant_overhead_s,
        )
        holding = _Holding(grant, time.monotonic())
        with self._mu:
            self._held[group] = holding
            if not r.was_resident:
                self._times.setdefault(group, _GroupTimes()).switch_s = switch_s
            self.grants.append(grant)
        renewer = threading.Thread(target=self._renew, args=(group, holding), daemon=True, name=f"renew-{group}")
        holding.renewer = renewer
        renewer.start()
        return grant

    def _check_phase(self, group: str, expected_phase_s: float) -> None:
        t = self._times.get(group, _GroupTimes())
        phase = expected_phase_s if expected_phase_s > 0 else t.phase_s
        if too_short(phase, t.switch_s, self.min_phase_ratio):
            raise PhaseTooShortError(
                f"phases of group {group!r} last {phase:.3f}s but a switch costs {t.switch_s:.3f}s (suspend +"
                f" restore + grant overhead, measured): time-slicing them loses more than it gains; hold the"
                f" group across several phases (one on_accelerators around them) or pass min_phase_ratio=0"
            )

    def release(self, group: str | None = None) -> None:
        """Yield the group (the only one held when ``group`` is None); offloads first when an
        offloader is set. LeaseLostError when the group had been taken from this job already."""
        with self._mu:
            if group is None:
                if len(self._held) != 1:
                    raise ValueError(f"release() needs group=: this client holds {sorted(self._held) or 'none'}")
                group = next(iter(self._held))
            holding = self._held.get(group)
            if holding is None:
                raise ValueError(f"release of group {group!r}: this client does not hold it")
            holding.depth -= 1
            if holding.depth > 0:
                return
            del self._held[group]
            holding.stop.set()
            self._times.setdefault(group, _GroupTimes()).phase_s = time.monotonic() - holding.entered
        _join(holding)
        if self.offloader is not None:
            self.offloader.offload()
        req = pb.YieldRequest(group=group, job=self.job, fencing_token=holding.grant.token)
        self._call(f"Yield of group {group!r} by {self.job!r}", self._stub.Yield, req, self._short())
        if holding.lost:
            raise LeaseLostError(holding.lost)

    yield_ = release

    def _renew(self, group: str, holding: _Holding) -> None:
        period = max(0.05, holding.grant.lease_ttl_s / 3)
        req = pb.RenewRequest(group=group, job=self.job, fencing_token=holding.grant.token)
        while not holding.stop.wait(period):
            try:
                self._call(f"Renew of group {group!r}", self._stub.Renew, req, self._short())
            except LeaseLostError as e:
                holding.lost = str(e)
                log.warning("time-slice lease lost", extra={"group": group, "err": str(e)})
                return
            except TimeSliceError as e:
                log.warning("time-slice renew failed", extra={"group": group, "err": str(e)})

    def on_accelerators(
        self, group_id: str, *, timeout_s: float | None = None, expected_phase_s: float = 0.0
    ) -> _Phase:
        """Acquire ``group_id`` around a block or a function (a decorator and a context manager)."""
        return _Phase(self, group_id, timeout_s, expected_phase_s)

    # ------------------------------------------------------------------ status
    def status(self, group: str) -> pb.StatusResponse:
        """The group's record; ``group`` is resolved in this client's job's namespace (a group belongs
        to one namespace), unless it names one (``namespace/name``)."""
        ns = self.job.partition("/")[0] if "/" in self.job else ""
        ref = f"{ns}/{group}" if ns and "/" not in group else group
        r: pb.StatusResponse = self._call("Status", self._stub.Status, pb.StatusRequest(group=ref), self._short())
        return r

    def list_groups(self) -> list[pb.StatusResponse]:
        r: pb.ListGroupsResponse = self._call(
            "ListGroups", self._stub.ListGroups, pb.ListGroupsRequest(), self._short()
        )
        return list(r.groups)

    def close(self) -> None:
        """Stop every lease renewal (waiting for an in-flight Renew), then close the channel: a
        renewal thread still inside a gRPC call when the interpreter exits can abort the process."""
        with self._mu:
            held = list(self._held.values())
            for h in held:
                h.stop.set()
        for h in held:
            _join(h)
        self._channel.close()


def _channel(target: str, ca_file: str | None, server_name: str | None, insecure: bool | None) -> grpc.Channel:
    """A TLS channel verified with ``ca_file`` (else the system roots); plaintext only when asked."""
    if insecure is None:
        insecure = os.environ.get(ENV_INSECURE, "").lower() in ("1", "true", "yes")
    if insecure:
        return grpc.insecure_channel(target)
    ca_file = ca_file if ca_file is not None else os.environ.get(ENV_CA_FILE)
    roots = None
    if ca_file:
        try:
            roots = Path(ca_file).read_bytes()
        except OSError as e:
            raise TimeSliceError(f"cannot read the orchestrator's CA {ca_file} ({ENV_CA_FILE}): {e.strerror}") from None
    name = server_name if server_name is not None else os.environ.get(ENV_SERVER_NAME)
    options = [("grpc.ssl_target_name_override", name)] if name else []
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots), options=options)


def _join(holding: _Holding, timeout_s: float = 10.0) -> None:
    """Wait for a stopped holding's renewal thread (it is woken at once unless a Renew is in flight)."""
    if holding.renewer is not None and holding.renewer is not threading.current_thread():
        holding.renewer.join(timeout_s)


class _Phase(contextlib.ContextDecorator):
    def __init__(self, client: TimeSliceOrchestratorClient, group: str, timeout_s: float | None, expected: float):
        self.client, self.group, self.timeout_s, self.expected = client, group, timeout_s, expected

    def __enter__(self) -> Grant:
        return self.client.acquire(self.group, timeout_s=self.timeout_s, expected_phase_s=self.expected)

    def __exit__(self, *exc: object) -> None:
        self.client.release(self.group)
