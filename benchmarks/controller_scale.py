"""The ElasticRLJob controller at scale: reconcile latency, and forecast change → planned suspend requests.

    python -m benchmarks.controller_scale --jobs 200 --nodes 1000 --json OUT.json

I/O boundary: the whole benchmark is I/O around a real system. A local control plane
(``local_cluster``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler with the
``rose-scheduler`` profile, KWOK) gets ``--nodes`` KWOK nodes (8 simulated GPUs each, the ROSE
driver's seed ResourceSlices, label ``rose.io/gpu-pool`` over ``--pools`` pools). The extender
and the controller run as their real processes (``python -m scheduler_extender``, ``python -m
elastic_controller``), both reading the ``static-file`` forecast backend: one JSON file of
ForecastResponse objects, rewritten atomically (write, then rename) to change the forecast.

1. Every pool is forecast idle; ``--jobs`` ElasticRLJobs (minGPUs 2, maxGPUs ``--max-workers``,
   1 GPU per worker) are created; the controller grows them to their maximum through the
   extender and kube-scheduler, and KWOK runs the bound pods ("workers running").
2. Once the controller is idle (``rose_controller_queue_idle``: the grow's last status and world
   writes done), the forecast of the first pool rises to its whole capacity. The planner must reclaim every
   worker there: its suspend requests (``rose.io/suspend-request`` by the controller) are seen on
   a pod watch; **plan-to-requests** is the time from the rename of the forecast file to the
   last of them (it includes the controller's forecast refresh and plan interval, both set by
   the flags below and reported).
3. Reconcile latency p50/p95 comes from the controller's own histogram
   ``rose_controller_reconcile_duration_seconds`` on its ``/metrics`` (per phase: the grow, and
   the reclaim, as differences of two scrapes; quantiles interpolated inside a bucket as PromQL
   does), and the plan time from ``rose_controller_plan_duration_seconds``.

No driver runs (KWOK nodes have none): nobody answers the suspend requests, which is all this
measures. :func:`measure` runs on an existing cluster (the e2e smoke test uses the session's).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._common import log, quantiles_ms
from rose_common import kwatch, names, promtext
from rose_common.forecast_api import ForecastPoint, ForecastResponse

REPO = Path(__file__).resolve().parent.parent
CONTROLLER_BY = '"rose-elastic-controller"'


@dataclass(frozen=True)
class Params:
    jobs: int = 200
    max_workers: int = 8
    plan_interval_s: float = 1.0
    forecast_refresh_s: float = 0.5
    controller_workers: int = 16
    write_concurrency: int = 8
    timeout_s: float = 900.0
    namespace: str = "bench"


# ---------------------------------------------------------------------------------------------
# forecasts


def forecast_doc(needs: dict[str, float]) -> dict[str, Any]:
    """The static-file backend's document: per pool, a flat p90 of ``need`` GPUs for the hour."""
    now = dt.datetime.now(dt.UTC)
    out = []
    for pool, need in sorted(needs.items()):
        points = [
            ForecastPoint(horizon_seconds=h, timestamp=now + dt.timedelta(seconds=h), quantiles={"0.9": need})
            for h in (600, 1800, 3600)
        ]
        resp = ForecastResponse(
            pool=pool,
            model_version="bench",
            generated_at=now,
            last_observation_at=now,
            data_age_seconds=0.0,
            stale=False,
            current=need,
            points=points,
        )
        out.append(json.loads(resp.model_dump_json()))
    return {"forecasts": out}


def write_forecasts(path: Path, needs: dict[str, float]) -> float:
    """Rewrite the forecast file atomically; returns the monotonic time of the rename."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(forecast_doc(needs)))
    tmp.replace(path)
    return time.monotonic()


# ---------------------------------------------------------------------------------------------
# metrics


def scrape(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def apiserver_writes(text: str) -> dict[str, float]:
    """Write requests the API server has served so far (``apiserver_request_total``), per
    ``VERB resource[/subresource]`` (pure)."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith("apiserver_request_total{"))
    out: dict[str, float] = {}
    for s in promtext.samples(lines, "apiserver_request_total"):
        if s.labels.get("verb") in WRITE_VERBS:
            sub = s.labels.get("subresource") or ""
            key = f"{s.labels['verb']} {s.labels.get('resource', '')}{'/' + sub if sub else ''}"
            out[key] = out.get(key, 0.0) + s.value
    return out


def writes_between(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """The API server's writes in a window: the total, per second, and the largest kinds (pure)."""
    d = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) > 0}
    total = sum(d.values())
    top = dict(sorted(d.items(), key=lambda kv: -kv[1])[:6])
    return {
        "total": int(total),
        "per_s": round(total / seconds, 1) if seconds > 0 else None,
        "by_kind": {k: int(v) for k, v in top.items()},
    }


def apiserver_metrics(handle: Any) -> str:
    """The API server's own ``/metrics`` page (the cluster's admin credentials)."""
    api = handle.api_client()
    try:
        m, url, headers, _, _ = api.param_serialize(
            method="GET",
            resource_path="/metrics",
            header_params={"Accept": "text/plain"},
            auth_settings=["BearerToken"],
        )
        resp = api.call_api(m, url, header_params=headers, _request_timeout=60)
        return str(resp.read().decode())
    finally:
        api.close()


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    return promtext.buckets(text, name)


def diff(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The observations between two scrapes of one cumulative histogram."""
    old = dict(before)
    return [(le, n - old.get(le, 0.0)) for le, n in after]


# ---------------------------------------------------------------------------------------------
# the pod watch


@dataclass
class PodLog:
    """What the benchmark's own pod watch saw, with monotonic timestamps."""

    node: dict[str, str] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    requested: dict[str, float] = field(default_factory=dict)  # the controller's suspend request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self, obj: dict[str, Any]) -> None:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        name, now = str(meta.get("name")), time.monotonic()
        with self.lock:
            if spec.get("nodeName"):
                self.node[name] = str(spec["nodeName"])
            if status.get("phase") == "Running":
                self.running.setdefault(name, now)
            req = (meta.get("annotations") or {}).get(names.ANNOTATION_SUSPEND_REQUEST, "")
            if CONTROLLER_BY in req:
                self.requested.setdefault(name, now)

    def count(self) -> tuple[int, int]:
        with self.lock:
            return len(self.running), len(self.requested)


def watch_pods(handle: Any, ns: str, pods: PodLog, stop: threading.Event) -> None:
    """List then watch the namespace's workers (raw JSON events: the watch stays cheap)."""
    from kubernetes import client
    from kubernetes.watch.watch import iter_resp_lines

    api = handle.api_client()
    core = client.CoreV1Api(api)
    selector = names.LABEL_JOB
    try:
        while not stop.is_set():
            try:
                listed = json.loads(core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False).data)
                for item in listed.get("items") or []:
                    pods.seen(item)
                resp = core.list_namespaced_pod(
                    ns,
                    label_selector=selector,
                    watch=True,
                    timeout_seconds=60,
                    resource_version=listed["metadata"]["resourceVersion"],
                    _preload_content=False,
                )
                try:
                    for _etype, obj in kwatch.events(iter_resp_lines(resp)):
                        pods.seen(obj)
                        if stop.is_set():
                            break
                finally:
                    resp.close()
                    resp.release_conn()
            except Exception as err:  # relist and go on; timestamps already taken stay
                if not stop.is_set():
                    log(f"pod watch restarted: {err!r}")
                    time.sleep(0.2)
    finally:
        api.close()


# ---------------------------------------------------------------------------------------------
# the run


def job_body(i: int, p: Params) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": f"job-{i:04d}"},
        "spec": {
            "minGPUs": min(2, p.max_workers),
            "maxGPUs": p.max_workers,
            "gpusPerWorker": 1,
            "gracefulShutdownPeriod": 30,
            "minUsefulRunSeconds": 60,
            "stateBytesPerWorker": 1 << 30,
            "template": {
                "spec": {"priorityClassName": "rose-rl", "containers": [{"name": "trainer", "image": "rose/grpo"}]}
            },
        },
    }


def _wait(what: str, fn: Any, timeout: float, every: float = 0.1) -> float:
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = 0.0
    while not fn():
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{what}: not reached after {timeout:.0f}s")
        if now - last > 15:
            last = now
            log(f"waiting: {what}")
        time.sleep(every)
    return time.monotonic() - t0


def _namespace(handle: Any, ns: str) -> None:
    from kubernetes import client

    api = handle.api_client()
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": ns}})

        def has_sa() -> bool:
            return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items)

        _wait("default ServiceAccount", has_sa, 60, 0.2)
    finally:
        api.close()


def _create_jobs(handle: Any, ns: str, p: Params) -> None:
    from kubernetes import client

    api = handle.api_client()
    custom = client.CustomObjectsApi(api)
    try:
        with ThreadPoolExecutor(max_workers=4) as ex:
            list(
                ex.map(
                    lambda i: custom.create_namespaced_custom_object(
                        names.GROUP, names.VERSION, ns, names.PLURAL, job_body(i, p)
                    ),
                    range(p.jobs),
                )
            )
    finally:
        api.close()


@contextlib.contextmanager
def _processes(handle: Any, fc: Path, p: Params, workdir: Path, metrics_port: int) -> Iterator[None]:
    from local_cluster import module_process

    assert handle.extender_url, "the cluster must run the rose-scheduler profile with an extender URL"
    host, _, port = handle.extender_url.removeprefix("http://").partition(":")
    common = [
        "--forecast-backend=static-file",
        f"--forecast-file={fc}",
        f"--forecast-refresh={p.forecast_refresh_s}",
        f"--kubeconfig={handle.kubeconfig}",
        "--log-level=warning",
    ]
    ctl = [
        "elastic_controller",
        *common,
        f"--plan-interval={p.plan_interval_s}",
        "--dwell=0",
        f"--workers={p.controller_workers}",
        f"--write-concurrency={p.write_concurrency}",
        "--lease-namespace=default",
        f"--lease-name=bench-{metrics_port}",
        f"--metrics-listen=127.0.0.1:{metrics_port}",
    ]
    with (
        module_process(["scheduler_extender", f"--listen={host}:{port}", *common], workdir / "extender.log"),
        module_process(ctl, workdir / "controller.log"),
    ):
        _wait("controller /metrics", lambda: _scrape_ok(metrics_port), 60, 0.5)
        yield


def _idle(port: int) -> bool:
    """Nothing queued or being reconciled, on two scrapes one plan round apart."""
    for i in range(2):
        if promtext.value(scrape(port), "rose_controller_queue_idle", None, 0.0) != 1.0:
            return False
        if i == 0:
            time.sleep(1.0)
    return True


def _scrape_ok(port: int) -> bool:
    try:
        return "rose_controller_leader 1.0" in scrape(port)
    except OSError:
        return False


def measure(handle: Any, pool_of: dict[str, str], p: Params, workdir: Path) -> dict[str, Any]:
    """Phases 1-3 of the module docstring on a running cluster whose nodes are ``pool_of``."""
    from local_cluster import free_port

    capacity = {pool: 0 for pool in pool_of.values()}
    for pool in pool_of.values():
        capacity[pool] += handle.gpus_per_node
    target_pool = sorted(capacity)[0]
    fc = workdir / "forecasts.json"
    write_forecasts(fc, dict.fromkeys(capacity, 0.0))
    metrics_port = free_port()
    _namespace(handle, p.namespace)
    pods, stop = PodLog(), threading.Event()
    watcher = threading.Thread(target=watch_pods, args=(handle, p.namespace, pods, stop), daemon=True)
    watcher.start()
    out: dict[str, Any] = {
        "params": {**p.__dict__, "nodes": len(pool_of), "pools": len(capacity), "gpus": sum(capacity.values())}
    }
    try:
        with _processes(handle, fc, p, workdir, metrics_port):
            workers = p.jobs * p.max_workers
            t0 = time.monotonic()
            _create_jobs(handle, p.namespace, p)
            log(f"{p.jobs} jobs created in {time.monotonic() - t0:.1f}s; waiting for {workers} workers running")
            _wait(f"{workers} workers running", lambda: pods.count()[0] >= workers, p.timeout_s, 0.5)
            out["grow_s"] = round(time.monotonic() - t0, 1)
            # the grow's last status and world writes done: the change meets a settled controller
            out["settle_s"] = round(_wait("controller idle", lambda: _idle(metrics_port), p.timeout_s, 0.5), 1)
            grown = scrape(metrics_port)
            with pods.lock:
                victims = {n for n, node in pods.node.items() if pool_of.get(node) == target_pool}
            log(
                f"grown in {out['grow_s']}s; forecast of {target_pool} rises to {capacity[target_pool]} GPUs "
                f"({len(victims)} workers there)"
            )
            out["load_average_at_change"] = [round(x, 1) for x in os.getloadavg()]  # the machine is shared
            # keys still queued from the grow: the reclaim's jobs wait behind them
            depth = promtext.value(scrape(metrics_port), "rose_controller_queue_depth", None, 0.0)
            out["queue_depth_at_change"] = int(depth)
            writes0 = apiserver_writes(apiserver_metrics(handle))
            t_change = write_forecasts(fc, {**dict.fromkeys(capacity, 0.0), target_pool: float(capacity[target_pool])})

            def all_requested() -> bool:
                with pods.lock:
                    return victims <= set(pods.requested)

            _wait(f"{len(victims)} suspend requests", all_requested, p.timeout_s, 0.02)
            window = time.monotonic() - t_change
            writes1 = apiserver_writes(apiserver_metrics(handle))
            with pods.lock:
                times = sorted(pods.requested[n] - t_change for n in victims)
            time.sleep(3 * p.plan_interval_s)
            reclaimed = scrape(metrics_port)
    finally:
        stop.set()
    out["victim_pool"], out["victims"] = target_pool, len(victims)
    out["suspend_requests"] = len(times)
    out["plan_to_first_request_s"] = round(times[0], 3) if times else None
    out["plan_to_requests_s"] = round(times[-1], 3) if times else None
    if times:  # the spread: a steady rate (a throughput limit) or a few late stragglers
        out["requests_at_s"] = {
            f"p{q}": round(times[min(len(times) - 1, len(times) * q // 100)], 3) for q in (10, 50, 90)
        }
    # every write the API server served from the forecast change to the last request (all clients)
    out["apiserver_writes_reclaim"] = writes_between(writes0, writes1, window)
    others = set(pods.requested) - victims
    victim_jobs = {_job_of(n) for n in victims}
    # a job at minGPUs is suspended as a whole gang: its workers in other pools go too
    out["gang_requests_elsewhere"] = sum(1 for n in others if _job_of(n) in victim_jobs)
    out["unexpected_requests"] = sum(1 for n in others if _job_of(n) not in victim_jobs)
    out.update(_latencies(grown, reclaimed))
    return out


def _job_of(pod_name: str) -> str:
    return pod_name.rsplit("-w", 1)[0]  # workers are named <job>-w<index>


def _latencies(grown: str, reclaimed: str) -> dict[str, Any]:
    rec, plan = "rose_controller_reconcile_duration_seconds", "rose_controller_plan_duration_seconds"
    return {
        "reconcile_grow": quantiles_ms(histogram(grown, rec)),
        "reconcile_reclaim": quantiles_ms(diff(histogram(reclaimed, rec), histogram(grown, rec))),
        "reconcile_all": quantiles_ms(histogram(reclaimed, rec)),
        "plan_all": quantiles_ms(histogram(reclaimed, plan)),
        "reconciles_ok": promtext.value(reclaimed, "rose_controller_reconciles_total", {"result": "ok"}, 0.0),
        "reconciles_error": promtext.value(reclaimed, "rose_controller_reconciles_total", {"result": "error"}, 0.0),
    }


def run(nodes: int, pools: int, p: Params, workdir: Path) -> dict[str, Any]:
    """A fresh local cluster with ``nodes`` KWOK nodes, then :func:`measure`; the cluster is torn down."""
    from benchmarks.scheduler_throughput import register_nodes
    from local_cluster import ClusterConfig, LocalCluster, reserved_port

    cfg = ClusterConfig(
        nodes=0,
        gpus_per_node=8,
        pools=pools,
        workdir=workdir / "cluster",
        extender_url=f"http://127.0.0.1:{reserved_port()}",
        die_with_parent=True,
    )
    lc = LocalCluster(cfg, progress=log)
    t0 = time.monotonic()
    handle = lc.up()
    try:
        pool_of = register_nodes(handle, nodes, gpus=8, pools=pools)
        up_s = round(time.monotonic() - t0, 1)
        out = measure(handle, pool_of, p, workdir)
        out["cluster_up_s"] = up_s
        return out
    finally:
        lc.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.controller_scale", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="ElasticRLJobs (minGPUs 2, maxGPUs --max-workers)")
    ap.add_argument("--nodes", type=int, default=1000, help="KWOK nodes of 8 simulated GPUs")
    ap.add_argument("--pools", type=int, default=4, help="GPU pools the nodes are spread over")
    ap.add_argument("--max-workers", type=int, default=8, help="workers (= GPUs) each job grows to")
    ap.add_argument("--plan-interval", type=float, default=1.0, help="the controller's --plan-interval, seconds")
    ap.add_argument("--forecast-refresh", type=float, default=0.5, help="the controller's --forecast-refresh, seconds")
    ap.add_argument("--controller-workers", type=int, default=16, help="the controller's --workers")
    ap.add_argument("--write-concurrency", type=int, default=8, help="the controller's --write-concurrency")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds each phase may take")
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--workdir", type=Path, help="cluster and process logs (default: a temporary directory)")
    a = ap.parse_args(argv)
    for flag, value, least in (
        ("--jobs", a.jobs, 1),
        ("--nodes", a.nodes, 1),
        ("--pools", a.pools, 1),
        ("--max-workers", a.max_workers, 1),
        ("--controller-workers", a.controller_workers, 1),
        ("--write-concurrency", a.write_concurrency, 1),
    ):
        if value < least:
            ap.error(f"{flag} must be >= {least}, got {value}")
    if a.jobs * a.max_workers > a.nodes * 8:
        ap.error(f"--jobs x --max-workers ({a.jobs * a.max_workers}) GPUs exceed --nodes x 8 ({a.nodes * 8})")
    p = Params(
        jobs=a.jobs,
        max_workers=a.max_workers,
        plan_interval_s=a.plan_interval,
        forecast_refresh_s=a.forecast_refresh,
        controller_workers=a.controller_workers,
        write_concurrency=a.write_concurrency,
        timeout_s=a.timeout,
    )
    with contextlib.ExitStack() as stack:
        workdir = a.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rose-ctl-scale-")))
        workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        out = run(a.nodes, a.pools, p, workdir)
        out["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
