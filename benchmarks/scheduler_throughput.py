"""kube-scheduler throughput with and without the ROSE extender, and extender latency per verb.

    python -m benchmarks.scheduler_throughput --nodes 1000 --pods 2000 --json OUT.json

1. Throughput, side by side: a local cluster (real etcd, kube-apiserver, kube-controller-manager,
   kube-scheduler, KWOK) with ``--nodes`` KWOK nodes x 8 simulated GPUs is brought up for each
   case: with the ``rose-scheduler`` profile calling our extender (started as a process at the
   profile's URL, static-file forecasts), and with the same profile and no extender, ``--rounds``
   times each in ABBA order (the figures are each side's median). ``--pods``
   ElasticRLJob worker pods, each with a lendable-GPU ResourceClaimTemplate, are created by 8
   client threads; pods/s = pods / (time the last pod was bound - time the first was created).
   Each case also reports, from the rose-scheduler's own metrics, the mean per-pod scheduling
   algorithm time split into in-tree plugins and the rest (the extender's round trips).
2. Extender latency per verb (p50/p99, client-measured round trip over HTTP/1.1 keep-alive to an
   extender process) at 1,000 and 5,000 nodes, by posting realistic requests directly: a full
   Pod body as kube-scheduler sends it, and as many NodeNames as kube-scheduler sends at that
   size (its adaptive percentageOfNodesToScore: 420 at 1,000 nodes, 500 at 5,000), plus the
   worst case with every node. The extender's cache is filled with a synthetic cluster of that
   size (nodes, 8-GPU slices, a quarter of GPUs lent, RL pods) through the same cache code the
   watch feeds. Beside the client's round trip, each verb reports the extender's own time per
   call, wall and on-CPU (``server_wall_*``, ``server_cpu_*``): a wall p99 far above the CPU p99
   is time the handler spent off the CPU (the machine's other processes, the GIL), not work. The
   in-cluster histogram from run 1 is reported too.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from benchmarks._common import log, quantiles_ms
from rose_common import kwatch, names, promtext, slices
from rose_common.forecast_api import ForecastPoint, ForecastResponse

REPO = Path(__file__).resolve().parent.parent
VERBS = ("filter", "prioritize", "preempt")


def feasible_nodes_to_find(n: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the default adaptive percentage."""
    if n < 100:
        return n
    pct = max(5, 50 - n // 125)
    return max(100, n * pct // 100)


def forecasts(pools: list[str], capacity: dict[str, int]) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    out = []
    for i, pool in enumerate(pools):
        # pools differ in how long they stay idle; every pool keeps ≥ 10 minutes (passes the filter)
        demand = {600: 0.1 * capacity[pool], 1800: (0.2 + 0.2 * i) * capacity[pool], 3600: 0.5 * capacity[pool]}
        out.append(
            json.loads(
                ForecastResponse(
                    pool=pool,
                    model_version="bench",
                    generated_at=now,
                    last_observation_at=now,
                    data_age_seconds=0.0,
                    stale=False,
                    current=None,
                    points=[
                        ForecastPoint(horizon_seconds=h, timestamp=now, quantiles={"0.9": d}) for h, d in demand.items()
                    ],
                ).model_dump_json()
            )
        )
    return out


def rl_pod(name: str, job: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {names.LABEL_JOB: job}},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,
            "priorityClassName": "rose-rl",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "lendable-1"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/rose/rl:1",
                    "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpu"}]},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def wait_http(host: str, port: int, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection(host, port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                c.close()
                return
            c.close()
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"http://{host}:{port}{path} not ready after {timeout}s")


def histogram_quantiles(metrics_text: str, verb: str) -> dict[str, float]:
    """p50/p99 from the extender's latency histogram (linear inside a bucket, as PromQL does)."""
    cumulative = promtext.buckets(metrics_text, "rose_extender_request_duration_seconds", {"verb": verb})
    return quantiles_ms(cumulative, (0.5, 0.99), 3)


_SCHED_POINTS = ("PreFilter", "Filter", "PreScore", "Score")


def scheduler_breakdown(port: int) -> dict[str, float]:
    """Where the rose-scheduler's serial scheduling cycle went, per scheduled pod (means in ms,
    from its own /metrics): the algorithm, its in-tree extension points, and the remainder —
    the extender calls (HTTP round trips) when an extender is configured."""
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # localhost, the cluster's own CA; only /metrics is read
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    point_metric = "scheduler_framework_extension_point_duration_seconds"
    profile = {"profile": "rose-scheduler"}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for point in _SCHED_POINTS:
        selector = {**profile, "extension_point": point}
        if promtext.samples(text, f"{point_metric}_count", selector):
            sums[point] = promtext.value(text, f"{point_metric}_sum", selector)
            counts[point] = promtext.value(text, f"{point_metric}_count", selector)
    algorithm = "scheduler_scheduling_algorithm_duration_seconds"
    if promtext.samples(text, f"{algorithm}_count"):
        sums["algorithm"] = promtext.value(text, f"{algorithm}_sum")
        counts["algorithm"] = promtext.value(text, f"{algorithm}_count")
    out = {f"{k}_ms": round(1000 * sums[k] / counts[k], 2) for k in sums if counts.get(k)}
    if "algorithm_ms" in out:
        out["outside_plugins_ms"] = round(out["algorithm_ms"] - sum(out.get(f"{p}_ms", 0.0) for p in _SCHED_POINTS), 2)
    return out


def register_nodes(handle: Any, n: int, gpus: int, pools: int, timeout_s: float = 900.0) -> dict[str, str]:
    """Create ``n`` KWOK GPU nodes (local_cluster's, default capacity) with their seed
    ResourceSlices, and wait until KWOK reports them all Ready."""
    from kubernetes import client

    from local_cluster import kwok_node

    api = handle.api_client()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    pool_of = {f"rose-node-{i}": f"pool-{chr(ord('a') + i % pools)}" for i in range(n)}

    def one(name: str) -> None:
        core.create_node(kwok_node(name, pool_of[name]))
        custom.create_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", slices.resource_slice(name, slices.simulated_gpus(name, gpus), 1)
        )

    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(one, pool_of))
        log(f"registered {n} nodes in {time.monotonic() - t0:.1f}s; waiting for Ready")
        deadline = time.monotonic() + timeout_s
        while True:
            ready = sum(
                1
                for node in core.list_node(label_selector=f"{names.LABEL_GPU_NODE}=true").items
                if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            )
            if ready >= n:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {ready}/{n} nodes Ready after {timeout_s}s")
            time.sleep(2)
        log(f"{n} nodes Ready after {time.monotonic() - t0:.1f}s")
    finally:
        api.close()
    return pool_of


def _start_extender(
    handle: Any, pools: dict[str, str], port: int, workdir: Path, ext_log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """`rose extender` on ``port`` with static forecasts for ``pools`` (the caller waits for it to be ready)."""
    cap = {p: 8 * sum(1 for q in pools.values() if q == p) for p in sorted(set(pools.values()))}
    pool_names = sorted(cap)
    fc = workdir / "forecasts.json"
    fc.write_text(json.dumps({"forecasts": forecasts(pool_names, cap)}))
    ext = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler_extender",
            f"--listen=127.0.0.1:{port}",
            f"--kubeconfig={handle.kubeconfig}",
            "--forecast-backend=static-file",
            f"--forecast-file={fc}",
            "--forecast-refresh=2",
            "--log-level=warning",
        ],
        cwd=REPO,
        stdout=ext_log,
        stderr=subprocess.STDOUT,
    )
    return ext


def _bench_namespace(api: Any, ns: str) -> None:
    """The ``bench`` namespace, once its default ServiceAccount exists, with the lendable claim template."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    deadline = time.monotonic() + 60
    while not any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items):
        if time.monotonic() > deadline:
            raise RuntimeError("no default ServiceAccount in the bench namespace")
        time.sleep(0.2)
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        ns,
        "resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "lendable-1"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS_LENDABLE, "count": 1}}
                        ]
                    }
                }
            },
        },
    )


def _watch_binds(w_api: Any, ns: str, pods: int, bound: dict[str, float], done: threading.Event) -> None:
    """Record when each pod in ``ns`` is first seen bound (``bound``), until ``pods`` are or ``done``."""
    from kubernetes import client
    from kubernetes.watch.watch import iter_resp_lines

    # raw JSON events (rose_common.kwatch): the benchmark's own watch stays cheap, since it
    # shares the 2 cores with the control plane it measures
    core_w = client.CoreV1Api(w_api)

    def seen(obj: dict[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if spec.get("nodeName") and meta.get("name") not in bound:
            bound[str(meta["name"])] = time.monotonic()

    while not done.is_set() and len(bound) < pods:
        try:
            listed = json.loads(core_w.list_namespaced_pod(ns, _preload_content=False).data)
            for item in listed.get("items") or []:
                seen(item)
            resp = core_w.list_namespaced_pod(
                ns,
                watch=True,
                timeout_seconds=300,
                resource_version=listed["metadata"]["resourceVersion"],
                _preload_content=False,
            )
            try:
                for _etype, obj in kwatch.events(iter_resp_lines(resp)):
                    seen(obj)
                    if done.is_set() or len(bound) >= pods:
                        break
            finally:
                resp.close()
                resp.release_conn()
        except Exception as err:  # relist and go on; the measurement keeps its timestamps
            log(f"bind watch restarted: {err}")
            time.sleep(0.2)


def _extender_metrics(port: int) -> dict[str, Any]:
    """The extender's own latency histogram per verb, and any non-200 request counts."""
    result: dict[str, Any] = {}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    result["extender_histogram"] = {v: histogram_quantiles(text, v) for v in VERBS}
    fails = [
        ln
        for ln in text.splitlines()
        if ln.startswith("rose_extender_requests_total") and 'code="200"' not in ln and not ln.endswith(" 0.0")
    ]
    result["extender_non_200"] = fails
    return result


def run_cluster_case(nodes: int, pods: int, with_extender: bool, workdir: Path) -> dict[str, Any]:
    from kubernetes import client

    from local_cluster import ClusterConfig, LocalCluster, free_port, stop_process

    port = free_port()
    url = f"http://127.0.0.1:{port}" if with_extender else None
    # The control plane comes up with no nodes; the benchmark registers its own KWOK nodes and
    # waits for them as long as a loaded 2-core machine needs (the harness allows 60 s).
    cfg = ClusterConfig(nodes=0, gpus_per_node=8, pools=4, workdir=workdir, extender_url=url)
    lc = LocalCluster(cfg, progress=log)
    t_up = time.monotonic()
    handle = lc.up()
    try:
        pools = register_nodes(handle, nodes, gpus=8, pools=4)
    except BaseException:
        lc.down()
        raise
    result: dict[str, Any] = {"cluster_up_s": round(time.monotonic() - t_up, 1)}
    ext: subprocess.Popen[bytes] | None = None
    ext_log = (workdir / "extender.log").open("wb")
    api = handle.api_client()
    try:
        if with_extender:
            ext = _start_extender(handle, pools, port, workdir, ext_log)
            wait_http("127.0.0.1", port, "/readyz", 120)
            time.sleep(2.5)  # first forecast refresh
        core = client.CoreV1Api(api)
        ns = "bench"
        _bench_namespace(api, ns)
        bound: dict[str, float] = {}
        done = threading.Event()
        w_api = handle.api_client()

        watcher = threading.Thread(target=_watch_binds, args=(w_api, ns, pods, bound, done), daemon=True)
        watcher.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(lambda i: core.create_namespaced_pod(ns, rl_pod(f"w-{i:05d}", f"job-{i % 50}")), range(pods)))
        created = time.monotonic()
        log(f"created {pods} pods in {created - t0:.1f}s; waiting for binds")
        deadline = time.monotonic() + max(600.0, pods * 0.5)
        while len(bound) < pods and time.monotonic() < deadline:
            time.sleep(0.5)
        done.set()
        w_api.close()
        if len(bound) < pods:
            raise RuntimeError(f"only {len(bound)}/{pods} pods bound before the deadline")
        elapsed = max(bound.values()) - t0
        result.update(
            pods=pods,
            nodes=nodes,
            seconds=round(elapsed, 2),
            pods_per_s=round(pods / elapsed, 2),
            create_seconds=round(created - t0, 2),
        )
        try:
            result["scheduling_cycle_per_pod"] = scheduler_breakdown(handle.ports["rose-scheduler"])
        except (OSError, KeyError, ValueError) as err:
            result["scheduling_cycle_per_pod"] = {"error": str(err)}
        if with_extender:
            result.update(_extender_metrics(port))
    finally:
        api.close()
        if ext is not None:
            stop_process(ext)
        ext_log.close()
        lc.down()
    return result


# ----------------------------------------------------------------------------- direct latency


def synthetic_cache(n: int) -> Any:
    from scheduler_extender.cache import ClusterCache

    cache = ClusterCache()
    for i in range(n):
        name = f"node-{i:05d}"
        cache.apply(
            "Node",
            "ADDED",
            {
                "metadata": {
                    "name": name,
                    "labels": {names.LABEL_POOL: f"pool-{i % 4}", names.LABEL_GPU_NODE: "true"},
                    "annotations": {names.ANNOTATION_HOST_MEM_FREE: str((512 + i % 7) * 2**30)},
                }
            },
        )
        cache.apply("ResourceSlice", "ADDED", slices.resource_slice(name, slices.simulated_gpus(name, 8), 1))
        lent = i % 4  # a quarter of the GPUs lent on average... 0..3 per node
        if lent:
            cache.apply(
                "ResourceClaim",
                "ADDED",
                {
                    "metadata": {"namespace": "rl", "name": f"c-{i}"},
                    "status": {
                        "allocation": {
                            "devices": {
                                "results": [
                                    {
                                        "request": "gpu",
                                        "driver": names.DRIVER_NAME,
                                        "pool": name,
                                        "device": f"gpu-{g}-lendable",
                                    }
                                    for g in range(lent)
                                ]
                            }
                        }
                    },
                },
            )
            cache.apply(
                "Pod",
                "ADDED",
                {
                    "metadata": {
                        "namespace": "rl",
                        "name": f"w-{i}",
                        "uid": f"uid-{i}",
                        "labels": {names.LABEL_JOB: f"job-{i % 50}"},
                        "annotations": {names.ANNOTATION_STATE_BYTES: str(40 * 2**30)},
                    },
                    "spec": {"nodeName": name},
                    "status": {"phase": "Running"},
                },
            )
    for kind in ("Node", "Pod", "ResourceClaim", "ResourceSlice"):
        cache.mark_synced(kind)
    cache.snapshot()
    return cache


def _serve(n: int, conn: Any) -> None:
    from scheduler_extender.forecast import reduce
    from scheduler_extender.server import Extender, ExtenderServer, settle_heap

    cache = synthetic_cache(n)
    pools = [f"pool-{i}" for i in range(4)]
    cap = {p: 8 * (n // 4) for p in pools}
    fcs = {f["pool"]: reduce(ForecastResponse.model_validate(f), "0.9") for f in forecasts(pools, cap)}

    class Static:
        def get(self, pool: str) -> Any:
            return fcs.get(pool)

    class NoSuspend:
        def request(self, pod: Any, reason: str, preemptor: Any) -> None:
            return

    class Timed(Extender):
        """The real handler, each call's wall and on-CPU time (its thread's) recorded: a call
        whose wall time far exceeds its CPU time waited off the CPU (other processes, the GIL)."""

        def handle(self, verb: str, body: bytes) -> tuple[int, bytes]:
            wall, cpu = time.perf_counter(), time.thread_time()
            out = super().handle(verb, body)
            calls.append((verb, time.perf_counter() - wall, time.thread_time() - cpu))
            return out

    calls: list[tuple[str, float, float]] = []
    settle_heap()  # what the extender does once its cache has synced
    sys.setswitchinterval(0.0005)  # the extender's --gil-switch-interval default
    srv = ExtenderServer(Timed(cache, forecasts=Static(), suspender=NoSuspend()), "127.0.0.1", 0).start()
    conn.send(srv.port)
    while conn.recv() == "calls":  # the parent asks for the calls recorded since it last asked
        conn.send(calls[:])
        calls.clear()
    srv.stop()


def _server_side(calls: list[tuple[str, float, float]], skip: int) -> dict[str, float]:
    """p50/p99 of the extender's own time per call (wall, and on its thread's CPU)."""
    wall = sorted(w * 1000 for _, w, _ in calls[skip:])
    cpu = sorted(c * 1000 for _, _, c in calls[skip:])
    at = min(len(wall) - 1, int(0.99 * len(wall)))
    return {
        "server_wall_p50_ms": round(statistics.median(wall), 3),
        "server_wall_p99_ms": round(wall[at], 3),
        "server_cpu_p50_ms": round(statistics.median(cpu), 3),
        "server_cpu_p99_ms": round(cpu[at], 3),
    }


def _pod_json(name: str, labels: dict[str, str], priority: int) -> dict[str, Any]:
    golden = REPO / "tests" / "support" / "extender_golden" / "filter-rl-request.json"
    pod: dict[str, Any] = json.loads(golden.read_text())["Pod"]
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"] = labels
    pod["spec"]["priority"] = priority
    return pod


def direct_latency(n: int, iterations: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(n, child), daemon=True)
    t_build = time.monotonic()
    proc.start()
    port = parent.recv()
    log(f"synthetic extender with {n} nodes ready in {time.monotonic() - t_build:.1f}s")
    rl = _pod_json("worker-x", {names.LABEL_JOB: "job-7"}, 0)
    serving = _pod_json("llm-x", {names.LABEL_ROLE: names.ROLE_SERVING}, 100000)
    all_names = [f"node-{i:05d}" for i in range(n)]
    out: dict[str, Any] = {}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for label, count in (("realistic", feasible_nodes_to_find(n)), ("all_nodes", n)):
            step = max(1, n // count)
            sent = all_names[::step][:count]
            cand = min(count, max(100, n // 10))  # DefaultPreemption candidates (10 %, at least 100)
            bodies = {
                "filter": json.dumps({"Pod": rl, "Nodes": None, "NodeNames": sent}).encode(),
                "prioritize": json.dumps({"Pod": rl, "Nodes": None, "NodeNames": sent}).encode(),
                "prioritize_serving": json.dumps({"Pod": serving, "Nodes": None, "NodeNames": sent}).encode(),
                "preempt": json.dumps(
                    {
                        "Pod": serving,
                        "NodeNameToVictims": None,
                        "NodeNameToMetaVictims": {
                            all_names[j]: {"Pods": [{"UID": f"uid-{j}"}, {"UID": f"other-{j}"}], "NumPDBViolations": 0}
                            for j in range(0, n, max(1, n // cand))[:cand]
                        },
                    }
                ).encode(),
            }
            res: dict[str, Any] = {"node_names": count, "preempt_candidates": cand}
            for verb, body in bodies.items():
                lat = []
                for k in range(iterations + 20):
                    t = time.perf_counter()
                    c.request("POST", "/" + verb.split("_")[0], body=body, headers={"Content-Type": "application/json"})
                    r = c.getresponse()
                    r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{verb}: HTTP {r.status}")
                    if k >= 20:  # warm-up excluded
                        lat.append((time.perf_counter() - t) * 1000)
                lat.sort()
                parent.send("calls")
                res[verb] = {
                    "p50_ms": round(statistics.median(lat), 3),
                    "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
                    "calls": len(lat),
                    "body_bytes": len(body),
                    **_server_side(parent.recv(), 20),
                }
            out[label] = res
        c.close()
    finally:
        parent.send("stop")
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scheduler_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=int(os.environ.get("ROSE_BENCH_NODES", "1000")))
    p.add_argument("--pods", type=int, default=int(os.environ.get("ROSE_BENCH_PODS", "2000")))
    p.add_argument(
        "--latency-nodes",
        default=os.environ.get("ROSE_BENCH_LATENCY_NODES", "1000,5000"),
        help="cluster sizes for the direct per-verb latency measurement",
    )
    p.add_argument("--iterations", type=int, default=int(os.environ.get("ROSE_BENCH_ITERATIONS", "300")))
    p.add_argument(
        "--rounds",
        type=int,
        default=int(os.environ.get("ROSE_BENCH_ROUNDS", "5")),
        help="cluster runs per side, in ABBA order; the figures are the medians (default 5: with 2, one"
        " disturbed round moved the ratio by 0.06)",
    )
    p.add_argument("--skip-cluster", action="store_true", help="only the direct latency measurement")
    p.add_argument("--workdir", default=os.environ.get("ROSE_BENCH_WORKDIR", ""))
    p.add_argument("--json", dest="json_out", default="", help="write the results here")
    args = p.parse_args(argv)
    if not args.skip_cluster and args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    report: dict[str, Any] = {
        "nodes": args.nodes,
        "pods": args.pods,
        "machine_cpus": os.cpu_count(),
        "started_at": datetime.now(UTC).isoformat(),
        "load_average_at_start": os.getloadavg(),
    }
    report["latency"] = {}
    for n in (int(x) for x in args.latency_nodes.split(",") if x):
        report["latency"][str(n)] = direct_latency(n, args.iterations)
        log(f"latency at {n} nodes: {json.dumps(report['latency'][str(n)])}")
    if not args.skip_cluster:
        base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rose-bench-"))
        # ABBA order (with, without, without, with, ...): a drift in the machine's load during the
        # run weighs on both sides alike; each side's figure is the median of its rounds.
        cases: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for with_ext in order:
                label = "with" if with_ext else "without"
                res = run_cluster_case(args.nodes, args.pods, with_ext, base / f"{label}-{r + 1}")
                res["round"] = r + 1
                log(f"round {r + 1} {label} extender: {res}")
                cases[with_ext].append(res)
        with_ps = statistics.median(c["pods_per_s"] for c in cases[True])
        without_ps = statistics.median(c["pods_per_s"] for c in cases[False])
        report["rounds"] = args.rounds
        report["with_extender"] = cases[True]
        report["without_extender"] = cases[False]
        report["pods_per_s_with"] = round(with_ps, 2)
        report["pods_per_s_without"] = round(without_ps, 2)
        report["ratio"] = round(with_ps / without_ps, 3)
        report["ratio_per_round"] = [
            round(w["pods_per_s"] / wo["pods_per_s"], 3) for w, wo in zip(cases[True], cases[False], strict=True)
        ]
        report["latency"].setdefault(str(args.nodes), {})["in_cluster_histogram"] = [
            c.get("extender_histogram") for c in cases[True]
        ]
    # flat per-verb figures (realistic request sizes) for the table
    for lat in report["latency"].values():
        if "realistic" in lat:
            for verb in VERBS:
                lat[verb] = {k: lat["realistic"][verb][k] for k in ("p50_ms", "p99_ms")}
    report["finished_at"] = datetime.now(UTC).isoformat()
    report["load_average_at_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
