"""How soon serving's GPU is tainted for lending, and untainted after (soak finding 2).

    python -m benchmarks.serving_taint --json OUT.json [--runs 10] [--workdir DIR]

On a real local cluster (``local_cluster``: kube-apiserver, kube-scheduler's DynamicResources, one
KWOK node with two simulated GPUs) with the real ``rose driver`` process (``--serving-wait=prepare``):
each run creates a serving pod pinned to GPU 0; once the scheduler has bound it (its claim
allocated), the driver's claim watch taints GPU 0's lendable device (soak finding T2: before, only
the prepare did); the run then plays NodePrepareResources, NodeUnprepareResources, and deletes the
pod (the claim controller deletes its claim). Per run:

* ``taint_s``: the pod seen bound → ``gpu-0-lendable`` carries ``rose.io/serving-holds`` in the
  API (the driver's ResourceSlice, polled every 20 ms); the scheduler writes the allocation before
  it binds the pod, so the window from the allocation is longer by that bind (not measured here);
* ``untaint_s``: the pod deleted and its claim unprepared → the taint gone from the API (through
  the claim controller's deletion of the claim).

``taint_s`` is the window in which the scheduler can still allocate GPU 0's lendable device to a
new RL claim (the driver's prepare-time refusal keeps it safe, and tells it once). Printed and in
the JSON: p50 / p90 / max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import log, own_slice_devices, simulated_driver


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _summary(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p90": _pct(xs, 0.9), "max": max(xs)}


def _tainted(api: Any, node: str) -> bool | None:
    """Whether gpu-0-lendable carries the serving-holds taint in the driver's slice (None: not published)."""
    from rose_common import names

    devices = own_slice_devices(api, node)
    if devices is None:
        return None
    (dev,) = [d for d in devices if d["name"] == "gpu-0-lendable"]
    return any(t.get("key") == names.TAINT_SERVING_HOLDS for t in dev.get("taints") or [])


def _runs(handle: Any, api: Any, runs: int, root: Path) -> list[dict[str, float]]:
    from kubernetes import client

    from local_cluster.objects import (
        allocated_claim,
        claim_template,
        create_claim_template,
        delete_namespace,
        gpu_pod,
        new_namespace,
        wait_for,
    )
    from rose_common import names

    node = handle.node_names[0]
    drv = simulated_driver(handle, root, "--serving-wait", "prepare")
    core = client.CoreV1Api(api)
    out: list[dict[str, float]] = []
    ns = new_namespace(api, "taint")
    try:
        wait_for("driver's slice", lambda: _tainted(api, node) is False, timeout=60)
        sel = ['device.attributes["gpu.rose.io"].index == 0']
        create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=sel))
        for i in range(runs):
            srv = f"serve-{i}"
            core.create_namespaced_pod(ns, gpu_pod(srv, "serve", node_name=node))
            wait_for("bound", lambda srv=srv: core.read_namespaced_pod(srv, ns).spec.node_name, 120, 0.02)  # type: ignore[misc]
            t0 = time.monotonic()
            wait_for("tainted", lambda: _tainted(api, node), 30, 0.02)
            taint = time.monotonic() - t0
            claim = allocated_claim(api, ns, srv)
            assert claim is not None
            assert drv.prepare(claim).error == ""
            core.delete_namespaced_pod(srv, ns, grace_period_seconds=0)
            assert drv.unprepare(claim).error == ""
            t1 = time.monotonic()
            wait_for("untainted", lambda: _tainted(api, node) is False, 60, 0.02)
            untaint = time.monotonic() - t1
            out.append({"taint_s": taint, "untaint_s": untaint})
            log(f"run {i}: tainted {taint:.3f}s after the pod was bound, untainted {untaint:.3f}s after its deletion")
            wait_for("pod gone", lambda: not core.list_namespaced_pod(ns).items, timeout=60)
    finally:
        delete_namespace(api, ns)
        drv.stop()
    return out


Runs = Callable[[Any, Any, int, Path], list[dict[str, float]]]


def taint_bench_main(prog: str, description: str, runs: Runs, prefixes: tuple[str, str], argv: list[str] | None) -> int:
    """The taint benchmarks' one entry point: a one-node local cluster, ``runs(handle, api, n,
    scratch)`` timed rows of ``taint_s`` / ``untaint_s``, their summary to ``--json``
    (``prefixes``: of the work folder and of the scratch folder)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--json", required=True, type=Path)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    from local_cluster.cluster import ClusterConfig, LocalCluster

    work = args.workdir or Path(tempfile.mkdtemp(prefix=prefixes[0]))
    lc = LocalCluster(
        ClusterConfig(
            nodes=1, gpus_per_node=2, pools=1, workdir=work / "cluster", extender_url=None, die_with_parent=True
        )
    )
    handle = lc.up()
    api = handle.api_client()
    try:
        rows = runs(handle, api, args.runs, Path(tempfile.mkdtemp(prefix=prefixes[1], dir="/tmp")))
    finally:
        api.close()
        lc.down()
    result: dict[str, Any] = {
        "runs": args.runs,
        **{k: _summary([r[k] for r in rows]) for k in ("taint_s", "untaint_s")},
    }
    result["samples"] = rows
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for k in ("taint_s", "untaint_s"):
        v = result[k]
        print(f"{k:10s} p50 {v['p50']:.3f} p90 {v['p90']:.3f} max {v['max']:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return taint_bench_main(
        "python -m benchmarks.serving_taint", (__doc__ or "").split("\n")[0], _runs, ("rose-taint-", "rose-td-"), argv
    )


if __name__ == "__main__":
    raise SystemExit(main())
