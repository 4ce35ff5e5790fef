"""Where a serving pod waits for its GPU's lent occupant: PreBind or NodePrepareResources (issue 27 §1).

    python -m benchmarks.serving_wait --json OUT.json [--runs 10] [--workdir DIR] [--grace 2]

On a real local cluster (``local_cluster``: kube-apiserver, kube-scheduler's DynamicResources,
one KWOK node with two simulated GPUs) with the real ``rose driver`` process (the suspend engine's
explicit ``simulated`` backend, a 1 GiB simulated occupant), once per ``--serving-wait`` mode:
each run prepares a lent claim on GPU 0 (an RL pod), then creates a serving pod whose claim the
scheduler allocates on GPU 0, and plays the kubelet's NodePrepareResources (the real gRPC
contract) as soon as the pod is bound. Per run, from the serving pod's creation:

* ``bound_s``: the pod bound by the scheduler (``spec.nodeName`` seen; polled every 20 ms);
* ``prepare_s``: the NodePrepareResources call alone;
* ``ready_s``: creation → the prepare returned (what serving waits in all).

Then the serving claim is unprepared (the occupant resumes) and both pods deleted. Printed and in
the JSON: p50 / p90 / max per mode. KWOK binds without a kubelet, so ``bound_s`` in prepare mode
is the scheduler alone; with a real kubelet the prepare runs after the container sandbox exists.
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


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _summary(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p90": _pct(xs, 0.9), "max": max(xs)}


def _run_mode(handle: Any, api: Any, mode: str, runs: int, grace: float, root: Path) -> list[dict[str, float]]:
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
    drv = simulated_driver(
        handle, root / mode, "--simulated-occupant-bytes", "1Gi", "--default-grace-seconds", f"{grace:g}",
        "--serving-wait", mode,
    )  # fmt: skip
    core = client.CoreV1Api(api)
    out: list[dict[str, float]] = []
    ns = new_namespace(api, f"wait-{mode}")
    try:
        want = mode == "prebind"

        def published() -> bool:
            devices = own_slice_devices(api, node) or []
            serving = [d for d in devices if d["name"].endswith("-serving")]
            return bool(serving) and all(bool(d.get("bindingConditions")) == want for d in serving)

        wait_for(f"{mode} driver's slice", published, timeout=60)
        sel = ['device.attributes["gpu.rose.io"].index == 0']
        create_claim_template(api, ns, claim_template("lent", names.DEVICE_CLASS_LENDABLE, selectors=sel))
        create_claim_template(api, ns, claim_template("serve", names.DEVICE_CLASS_SERVING, selectors=sel))
        for i in range(runs):
            rl, srv = f"rl-{i}", f"serve-{i}"
            core.create_namespaced_pod(ns, gpu_pod(rl, "lent", labels={names.LABEL_JOB: "j"}, node_name=node))
            rl_claim = wait_for("RL claim", lambda rl=rl: allocated_claim(api, ns, rl), timeout=60)  # type: ignore[misc]
            assert drv.prepare(rl_claim).error == ""
            t0 = time.monotonic()
            core.create_namespaced_pod(ns, gpu_pod(srv, "serve", node_name=node))
            wait_for("bound", lambda srv=srv: core.read_namespaced_pod(srv, ns).spec.node_name, 120, 0.02)  # type: ignore[misc]
            bound = time.monotonic() - t0
            claim = allocated_claim(api, ns, srv)
            assert claim is not None
            t1 = time.monotonic()
            res = drv.prepare(claim)
            t2 = time.monotonic()
            assert res.error == "", res.error
            out.append({"bound_s": bound, "prepare_s": t2 - t1, "ready_s": t2 - t0})
            log(f"{mode} run {i}: bound {bound:.3f}s prepare {t2 - t1:.3f}s ready {t2 - t0:.3f}s")
            assert drv.unprepare(claim).error == ""
            assert drv.unprepare(rl_claim).error == ""
            for p in (srv, rl):
                core.delete_namespaced_pod(p, ns, grace_period_seconds=0)
            wait_for("pods gone", lambda: not core.list_namespaced_pod(ns).items, timeout=60)
    finally:
        delete_namespace(api, ns)
        drv.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving_wait", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True, type=Path)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--grace", type=float, default=2.0, help="the occupant's grace period (s)")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    from local_cluster.cluster import ClusterConfig, LocalCluster

    work = args.workdir or Path(tempfile.mkdtemp(prefix="rose-wait-"))
    lc = LocalCluster(
        ClusterConfig(
            nodes=1, gpus_per_node=2, pools=1, workdir=work / "cluster", extender_url=None, die_with_parent=True
        )
    )
    handle = lc.up()
    api = handle.api_client()
    result: dict[str, Any] = {"runs": args.runs, "grace_s": args.grace, "modes": {}}
    try:
        root = Path(tempfile.mkdtemp(prefix="rose-wd-", dir="/tmp"))  # short: unix socket paths
        for mode in ("prebind", "prepare"):
            rows = _run_mode(handle, api, mode, args.runs, args.grace, root)
            result["modes"][mode] = {k: _summary([r[k] for r in rows]) for k in ("bound_s", "prepare_s", "ready_s")}
            result["modes"][mode]["samples"] = rows
    finally:
        api.close()
        lc.down()
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for mode, m in result["modes"].items():
        print(
            f"{mode:8s} "
            + "  ".join(
                f"{k} p50 {v['p50']:.3f} p90 {v['p90']:.3f} max {v['max']:.3f}" for k, v in m.items() if k != "samples"
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
