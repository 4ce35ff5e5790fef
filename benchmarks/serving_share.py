"""Serving's fraction beside an RL share on one GPU: what its prepare costs (issue 27 §3).

    python -m benchmarks.serving_share --json OUT.json [--runs 10] [--workdir DIR] [--serving-wait prebind]

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

``--serving-wait`` is the driver's (default ``prepare``: the suspend is in ``grow_s``). With
``prebind`` the serving fractions wait in the scheduler's PreBind instead (issue 27 §1 with §3), and
two more figures come first: ``beside_bind_s`` and ``grow_bind_s``, each serving pod's creation →
bound by the scheduler (the second includes the share's suspend, which the driver runs while the
scheduler waits); the prepares after them suspend nothing.

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
BIND_KEYS = ("beside_bind_s", "grow_bind_s")


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


def _allocate(
    api: Any, ns: str, node: str, name: str, template: str, labels: dict[str, str]
) -> tuple[dict[str, Any], float]:
    """The pod created, its claim once allocated, and when the pod was created (monotonic)."""
    from kubernetes import client

    from local_cluster.objects import allocated_claim, gpu_pod, wait_for
    from rose_common import names

    pod = gpu_pod(name, template, labels=labels, node_name=node)
    pod["metadata"]["annotations"] = {names.ANNOTATION_GRACE: "10"}
    t0 = time.monotonic()
    client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    claim: dict[str, Any] = wait_for(f"{name} allocated", lambda: allocated_claim(api, ns, name), timeout=60)
    return claim, t0


def _bound_after(api: Any, ns: str, name: str, t0: float) -> float:
    """Seconds from ``t0`` until the scheduler bound pod ``name`` (polled every 20 ms)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    while not core.read_namespaced_pod(name, ns).spec.node_name:
        if time.monotonic() - t0 > 120:
            raise RuntimeError(f"{name} not bound within 120 s")
        time.sleep(0.02)
    return time.monotonic() - t0


def _timed(fn: Any, claim: dict[str, Any]) -> float:
    t0 = time.monotonic()
    out = fn(claim)
    took = time.monotonic() - t0
    if out.error:
        raise RuntimeError(f"{claim['metadata']['name']}: {out.error}")
    return took


def _one_run(api: Any, drv: Any, node: str, ns: str, prebind: bool) -> dict[str, float]:
    from kubernetes import client

    from local_cluster.objects import wait_for
    from rose_common import names

    serving, rl = {names.LABEL_ROLE: "serving"}, {names.LABEL_JOB: "bench-share"}
    share, _ = _allocate(api, ns, node, "rl-share", "rl-share", rl)
    _timed(drv.prepare, share)
    core = client.CoreV1Api(api)

    def state() -> str:
        return str(
            (core.read_namespaced_pod("rl-share", ns).metadata.annotations or {}).get(names.ANNOTATION_SUSPEND_STATE)
        )

    row: dict[str, float] = {}
    a, t_a = _allocate(api, ns, node, "serve-a", "serve-60", serving)
    if prebind:  # the kubelet prepares only a bound pod: wait for the scheduler, as it would
        row["beside_bind_s"] = _bound_after(api, ns, "serve-a", t_a)
    row["beside_s"] = _timed(drv.prepare, a)
    if state() != "None":
        raise RuntimeError(f"the share was touched by a serving fraction that fits beside it: {state()}")
    b, t_b = _allocate(api, ns, node, "serve-b", "serve-40", serving)
    if prebind:
        row["grow_bind_s"] = _bound_after(api, ns, "serve-b", t_b)
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


def _runs(handle: Any, api: Any, runs: int, root: Path, serving_wait: str) -> list[dict[str, float]]:
    from kubernetes import client

    from local_cluster.objects import wait_for

    node = handle.node_names[0]
    drv = simulated_driver(
        handle, root, "--gpu-shares", "true", "--simulated-occupant-bytes", "1Gi", "--serving-wait", serving_wait
    )
    ns = "bench-serving-share"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    out: list[dict[str, float]] = []
    try:
        wait_for("driver's slice", lambda: own_slice_devices(api, node), timeout=60)
        _templates(ns, api)
        for i in range(runs):
            row = _one_run(api, drv, node, ns, serving_wait == "prebind")
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
    p.add_argument("--serving-wait", choices=["prepare", "prebind"], default="prepare")
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
        rows = _runs(handle, api, args.runs, Path(tempfile.mkdtemp(prefix="rose-ss-", dir="/tmp")), args.serving_wait)
    finally:
        api.close()
        lc.down()
    keys = (BIND_KEYS if args.serving_wait == "prebind" else ()) + KEYS
    result: dict[str, Any] = {
        "runs": args.runs,
        "servingWait": args.serving_wait,
        **{k: _summary([r[k] for r in rows]) for k in keys},
        "samples": rows,
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for k in keys:
        v = result[k]
        print(f"{k:13s} p50 {v['p50']:.3f} p90 {v['p90']:.3f} max {v['max']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
