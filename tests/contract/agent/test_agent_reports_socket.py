"""Workload reports and the job's world over the real agent's claim socket, with the real SDK.

The pod watch's view of a worker pod (``rose.io/world`` annotation, job label, pool) goes to the
agent's ReportBook exactly as the driver wires it (``observe_pod``); the SDK learns the world at
its next safe point, and its reports land in the ``rose_rl_*`` counters and the annotations the
driver writes on the pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from rose_common import names
from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_common.proto import rose_agent_v1_pb2_grpc as pb_grpc
from rose_sdk import Workload, World
from tests.support.agent_fixtures import running_agent

UID = "uid-w0"


def worker_pod(world: str | None, *, job: str = "job-a", pool: str = "pool-a") -> dict[str, Any]:
    ann = {names.ANNOTATION_WORLD: world} if world is not None else {}
    return {
        "metadata": {
            "name": "job-a-w0",
            "namespace": "rl",
            "uid": UID,
            "labels": {names.LABEL_JOB: job},
            "annotations": ann,
        },
        "spec": {"nodeSelector": {names.LABEL_POOL: pool}},
    }


def _sample(m: DriverMetrics, name: str) -> float | None:
    return m.registry.get_sample_value(name, {"namespace": "rl", "job": "job-a", "pool": "pool-a"})


def _workload(sock: Path) -> Workload:
    return Workload(model=torch.nn.Linear(4, 2), socket_path=str(sock), pod_uid=UID, report_interval_s=3600).start()


def _wait_world(wl: Workload, changes: int) -> None:
    for _ in range(100):  # each call blocks up to 0.2 s for a command; 20 s in all
        if wl.world_changes >= changes:
            return
        wl.safe_point(wait_seconds=0.2)
    raise AssertionError(f"world change {changes} not delivered; world={wl.world}")


def test_world_changes_reach_the_workload_at_safe_points(tmp_path: Path) -> None:
    seen: list[World] = []
    with running_agent(tmp_path) as agent:
        book = agent.server.reports  # type: ignore[attr-defined]
        wl = _workload(agent.claim_socket("claim-w0", UID, name="job-a-w0"))
        wl.on_world_change(seen.append)
        try:
            book.observe_pod(worker_pod("4/4"))
            _wait_world(wl, 1)
            book.observe_pod(worker_pod("2/4"))  # shrink
            _wait_world(wl, 2)
            book.observe_pod(worker_pod("2/4"))  # no change: nothing delivered
            book.observe_pod(worker_pod("garbage"))  # unreadable: ignored
            wl.safe_point(wait_seconds=0.5)
            book.observe_pod(worker_pod("3/4"))  # grow
            _wait_world(wl, 3)
        finally:
            wl.close()
    assert seen == [World(4, 4), World(2, 4), World(3, 4)]
    assert wl.world == World(3, 4)


def test_a_new_stream_gets_the_current_world_first(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        agent.server.reports.observe_pod(worker_pod("1/2"))  # type: ignore[attr-defined]
        wl = _workload(agent.claim_socket("claim-w0", UID, name="job-a-w0"))
        try:
            _wait_world(wl, 1)
        finally:
            wl.close()
    assert wl.world == World(1, 2)


def test_reports_count_progress_and_become_annotations(tmp_path: Path) -> None:
    metrics = DriverMetrics([])
    written: list[tuple[PodRef, dict[str, str]]] = []
    with running_agent(tmp_path) as agent:
        book = agent.server.reports  # type: ignore[attr-defined]
        book.metrics, book.publish = metrics, lambda ref, ann: written.append((ref, ann))
        book.observe_pod(worker_pod("2/2"))
        wl = _workload(agent.claim_socket("claim-w0", UID, name="job-a-w0"))
        try:
            assert wl.report("rollout", seconds_to_safe_point=3.5, steps=10, samples=640, tokens=9000, min_gpus=1)
            wl.add_progress(steps=5, samples=320, tokens=1000)
            assert not wl.report()  # same phase, inside report_interval_s: not sent
            assert wl.report(force=True)
            assert wl.report("train", seconds_to_safe_point=0.5)  # a phase change is sent at once
            latest = book.latest(UID)
            assert book.flush() == 1
        finally:
            wl.close()
    assert latest.phase == "train" and latest.steps == 15 and latest.samples == 960 and latest.tokens == 10000
    assert latest.min_gpus == 1 and latest.state_bytes == 40  # Linear(4, 2): 10 float32 parameters
    assert _sample(metrics, "rose_rl_steps_total") == 15
    assert _sample(metrics, "rose_rl_samples_total") == 960
    assert _sample(metrics, "rose_rl_tokens_total") == 10000
    ref, ann = written[0]
    assert ref == PodRef("rl", "job-a-w0", UID)
    assert ann == {
        names.ANNOTATION_WORKLOAD_PHASE: "train",
        names.ANNOTATION_SECONDS_TO_SAFE_POINT: "0.5",
        names.ANNOTATION_REPORTED_STATE_BYTES: "40",
        names.ANNOTATION_REPORTED_MIN_GPUS: "1",  # the minimum resources reach the pod (issue 10 §3)
    }


def test_bad_reports_are_refused_with_the_field_named(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        sock = agent.claim_socket("claim-w0", UID, name="job-a-w0")
        wl = _workload(sock)
        try:
            with pytest.raises(ValueError, match="seconds_to_safe_point"):
                wl.report("train", seconds_to_safe_point=-1)
            with pytest.raises(ValueError, match="steps must be >= 0"):
                wl.report("train", steps=-3)
            with grpc.insecure_channel(f"unix:{sock}") as ch:
                stub = pb_grpc.WorkloadAgentStub(ch)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.RpcError) as e:
                    stub.Report(pb.ReportRequest(pod_uid=UID, session_id=wl._session, phase="no spaces"), timeout=5)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "phase must be" in str(e.value.details())
                with pytest.raises(grpc.RpcError) as e:
                    stub.Report(pb.ReportRequest(pod_uid=UID, session_id="stale", phase="train"), timeout=5)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "call Register first" in str(e.value.details())
        finally:
            wl.close()


def test_a_reported_state_size_updates_the_registration(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        wl = _workload(agent.claim_socket("claim-w0", UID, name="job-a-w0"))
        wl._state_bytes = 12345
        try:
            assert wl.report("train", force=True)
            reg = agent.engine.registry.get(UID).reg  # type: ignore[attr-defined]
        finally:
            wl.close()
    assert reg.state_bytes == 12345
