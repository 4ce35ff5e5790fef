"""Layered-memory test support: an engine with the explicit simulated backend holding real bytes
(``SimulatedHostMemory``) and a disk tier, and the crash child the contract test kills.

    python tests/support/spill_fixtures.py crash-child ROOT   # with ROSE_DRIVER_CRASH_AT=<spill point>

The child suspends pod-a (fits the DRAM budget), then pod-b (does not: pod-a spills to disk) and
prints ``done``; a crash point ends it with exit code 137 somewhere inside the spill.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:
    sys.path.insert(0, str(HERE.parents[1]))

from prometheus_client import CollectorRegistry  # noqa: E402

from dra_driver.suspend.engine import EngineConfig, NodeSuspendEngine  # noqa: E402
from dra_driver.suspend.events import RecordingEventSink  # noqa: E402
from dra_driver.suspend.metrics import SuspendMetrics  # noqa: E402
from dra_driver.suspend.model import Registration  # noqa: E402
from dra_driver.suspend.simulated import SimulatedBackend, SimulatedHostMemory  # noqa: E402
from dra_driver.suspend.spill import SpillStore  # noqa: E402

MiB = 1 << 20
STATE = 3 * MiB  # each pod's state
DRAM = 4 * MiB  # holds one, not two


def reg(uid: str, nbytes: int = STATE) -> Registration:
    return Registration(uid, 4242, nbytes, frozenset({"simulated"}), "rl", uid)


def spill_engine(
    root: Path, dram: int = DRAM, disk: int = 64 * MiB, chunk_bytes: int = 1 * MiB
) -> tuple[NodeSuspendEngine, SimulatedHostMemory, RecordingEventSink]:
    host = SimulatedHostMemory(root / "host")
    events = RecordingEventSink()
    store = SpillStore(root / "spill", disk, chunk_bytes=chunk_bytes)
    eng = NodeSuspendEngine(
        EngineConfig(
            host_memory_budget_bytes=dram,
            backends=("simulated",),
            spill_dir=str(root / "spill"),
            spill_budget_bytes=disk,
        ),
        {"simulated": SimulatedBackend(1e12, sleep=lambda s: None, host=host)},
        events=events,
        metrics=SuspendMetrics(CollectorRegistry()),
        spill=store,
    )
    return eng, host, events


def crash_child(root: Path) -> int:
    eng, _, _ = spill_engine(root)
    for uid in ("pod-a", "pod-b"):
        eng.register(reg(uid))
        if uid == "pod-b":
            print("spilling", flush=True)  # the next suspend spills pod-a: a random SIGKILL aims here
        rec = eng.suspend_pod(uid, 30.0)
        if rec.state != "succeeded":
            print(f"suspend {uid} failed: {rec.message}", flush=True)
            return 1
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "crash-child":
        sys.exit(crash_child(Path(sys.argv[2])))
    sys.exit("usage: spill_fixtures.py crash-child ROOT")
