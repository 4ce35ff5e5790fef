"""A Transformers rollout engine suspended and resumed by the real node agent, mid rollout loop.

The loop generates a batch per step (per-prompt seeds) and calls ``safe_point`` between batches; the
test suspends it through NodeControl (the engine sleeps: level 1 parks its weights in host memory,
level 2 drops them), checks the loop is parked and the weights gone, resumes it (wake; level 2
reloads the weights from the trainer's copy) and checks the samples and the weights equal an
uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rose_common.proto import rose_agent_v1_pb2 as pb
from rose_sdk import tensors_equal
from rose_sdk.integrations.rollout import Sample, attach, offloader_of
from rose_sdk.integrations.transformers_generate import TransformersGenerateEngine
from tests.support import rollout_tiny
from tests.support.agent_fixtures import running_agent, wait_registered

STEPS = 6


def _seeds(step: int) -> list[int]:
    return [1000 * step + i for i in range(len(rollout_tiny.PROMPTS))]


@pytest.mark.parametrize("level", [1, 2])
def test_engine_sleeps_on_suspend_and_wakes_on_resume_mid_rollout(tmp_path: Path, level: int) -> None:
    engine = TransformersGenerateEngine(rollout_tiny.model(0), rollout_tiny.tokenizer(), batch_invariant=False)
    trainer_weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    expected = [engine.generate(rollout_tiny.PROMPTS, _seeds(s), max_new_tokens=8) for s in range(STEPS)]

    with running_agent(tmp_path) as agent:
        wl = attach(
            engine,
            level=level,
            weights=(lambda: trainer_weights) if level == 2 else None,
            socket_path=str(agent.claim_socket("claim-rollout", "uid-rollout")),
            pod_uid="uid-rollout",
            pod_namespace="rl",
            pod_name="rollout",
        ).start()
        got: list[list[Sample]] = []
        errors: list[BaseException] = []
        step_done = threading.Semaphore(0)

        def loop() -> None:
            try:
                for step in range(STEPS):
                    got.append(engine.generate(rollout_tiny.PROMPTS, _seeds(step), max_new_tokens=8))
                    step_done.release()
                    wl.safe_point(step)
            except BaseException as e:  # surfaced by the assertions below
                errors.append(e)

        t = threading.Thread(target=loop, daemon=True)
        try:
            wait_registered(agent.engine, "uid-rollout")
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-rollout")).workloads[0]
            assert st.state_bytes == engine.device_bytes() > 0  # registered with the engine's size
            nbytes = engine.device_bytes()
            t.start()
            for _ in range(3):
                assert step_done.acquire(timeout=60)
            op = agent.control.Suspend(pb.SuspendRequest(pod_uid="uid-rollout", grace_seconds=30, reason="serving"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            assert op.backend == pb.BACKEND_COOPERATIVE and op.fallback == ""
            assert op.bytes_moved == (nbytes if level == 1 else 0)  # level 2 drops the weights, moves nothing
            assert engine.sleeping
            if level == 2:
                assert all(p.numel() == 0 for p in engine.model.parameters())
            st = agent.control.Status(pb.StatusRequest(pod_uid="uid-rollout")).workloads[0]
            assert st.state == pb.WORKLOAD_STATE_SUSPENDED
            parked = len(got)
            time.sleep(0.3)
            assert len(got) == parked < STEPS  # the loop waits inside safe_point
            op = agent.control.Resume(pb.ResumeRequest(pod_uid="uid-rollout"))
            assert op.state == pb.OPERATION_STATE_SUCCEEDED, op.message
            t.join(timeout=120)
            assert not t.is_alive() and not errors, errors
        finally:
            wl.close()
        stats = offloader_of(wl).stats
        assert (stats.sleeps, stats.wakes, stats.reloads) == (1, 1, 1 if level == 2 else 0)
        assert tensors_equal(engine.model.state_dict(), trainer_weights)  # weights equal after wake
        assert got == expected  # every batch, before and after the suspend, as an uninterrupted run's
        assert agent.events.reasons() == ["Suspended", "Resumed"]
