"""rose_sdk's workload object without an agent: module-level API, hooks, checkpoint, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rose_sdk
from rose_sdk import AgentError, Workload, load_checkpoint


def test_module_api_without_agent_is_a_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ROSE_AGENT_SOCKET", raising=False)
    monkeypatch.setenv("ROSE_CHECKPOINT_PATH", str(tmp_path / "c.rose"))
    monkeypatch.setenv("ROSE_CLAIM_UID_C1", "c1")
    monkeypatch.setenv("ROSE_CLAIM_UID_C2", "c2")
    m = torch.nn.Linear(2, 2)
    wl = rose_sdk.init(model=m, user_state=lambda: {"k": 1})
    assert rose_sdk.current() is wl and not wl.connected_to_agent and wl.claim_uids == ["c1", "c2"]

    @rose_sdk.on_suspend
    def hook() -> None:
        pass

    assert rose_sdk.safe_point(5) == 0 and wl.step == 5
    info = wl.checkpoint_now()
    c = load_checkpoint(info.path)
    assert c.step == 5 and c.user_state == {"k": 1}
    wl.close()


def test_unreachable_agent_is_a_clear_error(tmp_path: Path) -> None:
    wl = Workload(model=torch.nn.Linear(1, 1), socket_path=str(tmp_path / "none.sock"), pod_uid="u")
    with pytest.raises(AgentError, match="refused the registration"):
        wl.start()


def test_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROSE_CHECKPOINT_PATH", raising=False)
    with pytest.raises(ValueError, match="unknown backend"):
        Workload(backends=["teleport"])
    with pytest.raises(AgentError, match="no checkpoint path"):
        Workload(checkpoint_path=None, socket_path="").checkpoint_now()
