"""The example trainer keeps training through world changes delivered by the real node agent.

Two workers of one job (each its own pod, claim socket and SDK subprocess) run
``examples/01_cartpole_reinforce.py --global-episodes 4``; the job shrinks 2/2 → 1/2 and grows
back → 2/2 at fixed updates (``--world-points``: each worker waits there for the change). The
world goes the way the driver sends it: the pod's ``rose.io/world`` annotation → the agent's
ReportBook (the pod watch's observer) → ``COMMAND_KIND_WORLD`` on the command stream. Both end
(no hang), adapt their episodes per update to the world, learn (longer episodes at the end), and
are bit-identical to each other: the same schedule of changes gives the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rose_common import names
from rose_sdk import tensors_equal
from tests.support.agent_fixtures import WorkloadProc, reaped, running_agent, start_workload, wait_registered

UPDATES = 60
POINTS = (15, 30, 45)
SCHEDULE = ("2/2", "1/2", "2/2")  # the k-th change lands at update POINTS[k]
ARGS = [
    "--updates",
    str(UPDATES),
    "--seed",
    "5",
    "--global-episodes",
    "4",
    "--world-points",
    ",".join(map(str, POINTS)),
]


def _pod(uid: str, world: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"job-{uid}",
            "namespace": "rl",
            "uid": uid,
            "labels": {names.LABEL_JOB: "job"},
            "annotations": {names.ANNOTATION_WORLD: world},
        }
    }


def _await(w: WorkloadProc, k: int, seen: list[str]) -> None:
    assert w.proc.stdout is not None
    for line in w.proc.stdout:
        seen.append(line)
        if line.strip() == f"AWAIT_WORLD {k}":
            return
    raise AssertionError(f"worker exited before world point {k}: rc={w.proc.wait()}")


def test_training_adapts_to_world_changes_deterministically(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        book = agent.server.reports  # type: ignore[attr-defined]
        socks = {uid: agent.claim_socket(f"claim-{uid}", uid, name=f"job-{uid}") for uid in ("w0", "w1")}
        workers = {
            uid: start_workload(tmp_path, f"job-{uid}", socket=s, pod_uid=uid, extra=ARGS) for uid, s in socks.items()
        }
        with reaped(*workers.values()):
            for uid, w in workers.items():
                w.wait_ready()
                wait_registered(agent.engine, uid)
            seen: dict[str, list[str]] = {uid: [] for uid in workers}
            for k, world in enumerate(SCHEDULE, start=1):
                for uid, w in workers.items():
                    _await(w, k, seen[uid])
                    book.observe_pod(_pod(uid, world))  # what the driver's pod watch hands the agent
            outs = ["".join(seen[uid]) + w.finish(timeout=300) for uid, w in workers.items()]
        runs = [torch.load(w.out, weights_only=False) for w in workers.values()]
    for out in outs:
        assert "WORLD 1/2 update=30 episodes=4" in out and "WORLD 2/2 update=45 episodes=2" in out, out[-2000:]
    a, b = runs
    assert a["worlds"] == b["worlds"] == [(15, 2, 2), (30, 1, 2), (45, 2, 2)]
    per = a["per_update"]
    assert len(per) == UPDATES
    assert sum(per[-10:]) / 10 > 2 * sum(per[:10]) / 10, per  # it learns through the changes
    assert tensors_equal(a["model"], b["model"]) and tensors_equal(a["optimizer"], b["optimizer"])
    assert a["lengths"] == b["lengths"] and a["per_update"] == b["per_update"]
