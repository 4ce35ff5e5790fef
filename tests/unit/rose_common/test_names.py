"""Shared names: one suspend-state enum for the driver and the engine, wire strings unchanged."""

from __future__ import annotations

import json

from dra_driver import node
from dra_driver.suspend import model
from rose_common.names import SuspendState


def test_suspend_state_wire_strings() -> None:
    assert [s.value for s in SuspendState] == ["Running", "Suspending", "Suspended", "Resuming", "CheckpointedEvicted"]
    assert json.dumps({"s": SuspendState.SUSPENDED}) == '{"s": "Suspended"}'
    assert f"{SuspendState.CHECKPOINTED_EVICTED}" == "CheckpointedEvicted"


def test_driver_and_engine_use_the_one_enum() -> None:
    assert set(model.WORKLOAD_STATES) == set(SuspendState)
    assert all(isinstance(s, SuspendState) for s in model.WORKLOAD_STATES)
    pod_states = (
        node.POD_RUNNING,
        node.POD_SUSPENDING,
        node.POD_SUSPENDED,
        node.POD_RESUMING,
        node.POD_CHECKPOINTED_EVICTED,
    )
    assert all(isinstance(s, SuspendState) for s in pod_states)
