"""rose.agent.v1 NodeControl over a real unix socket refuses a hand-over command whose fencing
token is older than the last one it saw for the group (a stale orchestrator)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rose_common.proto import rose_agent_v1_pb2 as pb
from tests.support.agent_fixtures import running_agent

NOT_FOUND, STALE, BAD = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT


def _refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details() or ""


def test_stale_token_is_refused_and_newer_ones_pass_the_fence(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        ctl = agent.control

        def suspend(token: str) -> grpc.StatusCode:
            return _refusal(lambda: ctl.Suspend(pb.SuspendRequest(pod_uid="p", fencing_token=token)))[0]

        def resume(token: str) -> tuple[grpc.StatusCode, str]:
            return _refusal(lambda: ctl.Resume(pb.ResumeRequest(pod_uid="p", fencing_token=token)))

        assert suspend("g:5") == NOT_FOUND  # admitted by the fence; the engine has no such workload
        code, details = resume("g:4")
        assert code == STALE and "older than 5" in details
        assert suspend("g:3") == STALE
        assert resume("g:6")[0] == NOT_FOUND and resume("h:1")[0] == NOT_FOUND  # newer; another group
        assert resume("bad")[0] == BAD
