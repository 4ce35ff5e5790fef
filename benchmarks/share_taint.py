"""How soon the planner's reclaim taint reaches a GPU's share device, and leaves it (issue 27 §2/§3).

    python -m benchmarks.share_taint --json OUT.json [--runs 10] [--workdir DIR]

On a real local cluster (``local_cluster``: kube-apiserver, one KWOK node with two simulated GPUs)
with the real ``rose driver --gpu-shares`` process: each run creates the DeviceTaintRule the
elastic controller writes for ``gpu-0-lendable`` (``rose.io/reclaim-planned``, NoSchedule), then
deletes it. Per run:

* ``taint_s``: the rule's create returned → ``gpu-0-share`` carries the taint in the driver's
  ResourceSlice (polled every 20 ms);
* ``untaint_s``: the rule's delete returned → the taint gone from the slice.

``taint_s`` is the window in which the scheduler can still allocate a share claim on a GPU the
planner has already tainted (the rule covers the lendable device at once). Printed and in the JSON:
p50 / p90 / max.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks._common import log, own_slice_devices, simulated_driver
from benchmarks.serving_taint import taint_bench_main

RULES = ("resource.k8s.io", "v1", "devicetaintrules")


def _tainted(api: Any, node: str) -> bool | None:
    """Whether gpu-0-share carries the reclaim taint in the driver's slice (None: not published)."""
    from rose_common import names

    devices = own_slice_devices(api, node)
    if devices is None:
        return None
    (dev,) = [d for d in devices if d["name"] == "gpu-0-share"]
    return any(t.get("key") == names.TAINT_RECLAIM_PLANNED for t in dev.get("taints") or [])


def _rule(node: str) -> dict[str, Any]:
    from rose_common import names

    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"rose-reclaim-bench-{node}.gpu-0-lendable", "labels": {names.LABEL_TAINT_POOL: "b"}},
        "spec": {
            "deviceSelector": {"driver": names.DRIVER_NAME, "pool": node, "device": "gpu-0-lendable"},
            "taint": {"key": names.TAINT_RECLAIM_PLANNED, "value": "b", "effect": "NoSchedule"},
        },
    }


def _runs(handle: Any, api: Any, runs: int, root: Path) -> list[dict[str, float]]:
    from kubernetes import client

    from local_cluster.objects import wait_for

    node = handle.node_names[0]
    drv = simulated_driver(handle, root, "--gpu-shares", "true")
    rules = client.CustomObjectsApi(api)
    body = _rule(node)
    out: list[dict[str, float]] = []
    try:
        wait_for("driver's slice", lambda: _tainted(api, node) is False, timeout=60)
        for i in range(runs):
            rules.create_cluster_custom_object(*RULES, body)
            t0 = time.monotonic()
            wait_for("tainted", lambda: _tainted(api, node), 30, 0.02)
            taint = time.monotonic() - t0
            rules.delete_cluster_custom_object(*RULES, body["metadata"]["name"])
            t1 = time.monotonic()
            wait_for("untainted", lambda: _tainted(api, node) is False, 30, 0.02)
            untaint = time.monotonic() - t1
            out.append({"taint_s": taint, "untaint_s": untaint})
            log(f"run {i}: share device tainted {taint:.3f}s after the rule, untainted {untaint:.3f}s after its delete")
    finally:
        drv.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    return taint_bench_main(
        "python -m benchmarks.share_taint",
        (__doc__ or "").split("\n")[0],
        _runs,
        ("rose-sharetaint-", "rose-st-"),
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
