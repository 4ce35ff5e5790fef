"""Serving's fraction beside an RL share on one GPU: what its prepare costs (issue 27 §3).

    python -m benchmarks.serving_share --json OUT.json [--runs 10] [--workdir DIR]

On a real local cluster (``local_cluster``: kube-apiserver, kube-scheduler, one KWOK node with two
simulated GPUs of 141 GiB) with the real ``rose driver --gpu-shares`` process (the node suspend
engine on its explicit ``simulated`` backend, 1 GiB of simulated state per occupant). Each run: an
RL share of 60 GiB + 40 % on GPU 0 is allocated by the scheduler and prepared; then, this harness
playing the kubelet (NodePrepareResources over the driver's unix socket):

* ``beside_s``: the prepare of serving's 60 GiB + 40 % fraction on the same GPU (both fit: nothing
  is suspended);
* ``grow_s``: the prepare of a second serving fraction of 40 GiB + 30 % (serving then needs 100 GiB /
  70 %: the driver suspends the share first — cooperative, simulated state moved to host memory);
* ``shrink_s``: that serving fraction's unprepare (the share resumed).

The pods and claims are deleted between runs. Printed and in the JSON: p50 / p90 / max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import log, own_slice_devices, simulated_driver

KEYS = ("beside_s", "grow_s", "shrink_s")


def _summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"p50": statistics.median(s), "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "max": s[-1]}


def _templates(ns: str, api: Any) -> None:
    from kubernetes import client

    from rose_common import names

    def template(name: str, cls: str, memory: str, compute: str) -> dict[str, Any]:
        exactly = {
            "deviceClassName": cls,
            "count": 1,
            "capacity": {"requests": {"memory": memory, "compute": compute}},
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.rose.io"].index == 0'}}],
        }
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        }

    objs = client.CustomObjectsApi(api)
    for body in (
        template("rl-share", names.DEVICE_CLASS_SHARE, "60Gi", "40"),
        template("serve-60", names.DEVICE_CLASS_SERVING_SHARE, "60Gi", "40"),
        template("serve-40", names.DEVICE_CLASS_SERVING_SHARE, "40Gi", "30"),
    ):
        objs.create_namespaced_custom_object("resource.k8s.io", "v1", ns, "resourceclaimtemplates", body)


def _allocate(api: Any, ns: str, node: str, name: str, template: str, labels: dict[str, str]) -> dict[str, Any]:
    from kubernetes import client

    from local_cluster.objects import allocated_claim, gpu_pod, wait_for
    from rose_common import names

    pod = gpu_pod(name, template, labels=labels, node_name=node)
    pod["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "10"}
    client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    claim: dict[str, Any] = wait_for(f"{name} allocated", lambda: allocated_claim(api, ns, name), timeout=60)
    return claim


def _timed(fn: Any, claim: dict[str, Any]) -> float:
    t0 = time.monotonic()
    out = fn(claim)
    took = time.monotonic() - t0
    if out.error:
        raise RuntimeError(f"{claim['metadata']['name']}: {out.error}")
    return took


def _one_run(api: Any, drv: Any, node: str, ns: str) -> dict[str, float]:
    from kubernetes import client

    from local_cluster.objects import wait_for
    from rose_common import names

    serving, rl = {names.LABEL_ROLE: "serving"}, {names.LABEL_JOB: "bench-share"}
    share = _allocate(api, ns, node, "rl-share", "rl-share", rl)
    _timed(drv.prepare, share)
    a = _allocate(api, ns, node, "serve-a", "serve-60", serving)
    b = _allocate(api, ns, node, "serve-b", "serve-40", serving)
    core = client.CoreV1Api(api)

    def state() -> str:
        return str(
            (core.read_namespaced_pod("rl-share", ns).metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_STATE)
        )

    row = {"beside_s": _timed(drv.prepare, a)}
    if state() != "None":
        raise RuntimeError(f"the share was touched by a serving fraction that fits beside it: {state()}")
    row["grow_s"] = _timed(drv.prepare, b)
    if state() != "Suspended":
        raise RuntimeError(f"serving's growth did not suspend the share: {state()}")
    row["shrink_s"] = _timed(drv.unprepare, b)
    for c in (a, share):
        _timed(drv.unprepare, c)
    for p in ("rl-share", "serve-a", "serve-b"):
        core.delete_namespaced_pod(p, ns, grace_period_seconds=0)

    def gone() -> bool:
        claims = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims"
        )
        return not core.list_namespaced_pod(ns).items and not claims["items"]

    wait_for("pods and claims gone", gone, timeout=60)
    return row


def _runs(handle: Any, api: Any, runs: int, root: Path) -> list[dict[str, float]]:
    from kubernetes import client

    from local_cluster.objects import wait_for

    node = handle.node_names[0]
    drv = simulated_driver(handle, root, "--gpu-shares", "true", "--simulated-occupant-bytes", "1Gi")
    ns = "bench-serving-share"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    out: list[dict[str, float]] = []
    try:
        wait_for("driver's slice", lambda: own_slice_devices(api, node), timeout=60)
        _templates(ns, api)
        for i in range(runs):
            row = _one_run(api, drv, node, ns)
            out.append(row)
            log(f"run {i}: " + ", ".join(f"{k} {v:.3f}s" for k, v in row.items()))
    finally:
        drv.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving_share", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--json", required=True, type=Path)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    from local_cluster.cluster import ClusterConfig, LocalCluster

    work = args.workdir or Path(tempfile.mkdtemp(prefix="rose-servingshare-"))
    lc = LocalCluster(
        ClusterConfig(
            nodes=1, gpus_per_node=2, pools=1, workdir=work / "cluster", extender_url=None, die_with_parent=True
        )
    )
    handle = lc.up()
    api = handle.api_client()
    try:
        rows = _runs(handle, api, args.runs, Path(tempfile.mkdtemp(prefix="rose-ss-", dir="/tmp")))
    finally:
        api.close()
        lc.down()
    result: dict[str, Any] = {"runs": args.runs, **{k: _summary([r[k] for r in rows]) for k in KEYS}, "samples": rows}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for k in KEYS:
        v = result[k]
        print(f"{k:9s} p50 {v['p50']:.3f} p90 {v['p90']:.3f} max {v['max']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
