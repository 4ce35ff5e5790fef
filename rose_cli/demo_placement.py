"""Demo act: lend by forecast. The predictor's model forecasts serving demand per pool; the
scheduler extender, called over HTTP by the real kube-scheduler (profile ``rose-scheduler``),
places an ElasticRLJob's workers where serving is forecast to stay idle longest.

Demand comes from the predictor's embedded generator (one quiet pool, one busy pool), fitted
with the predictor's real quantile model in this process; its ForecastResponse objects reach the
extender through the extender's explicit ``static-file`` forecast backend (``rose predictor
serve`` feeds the ``http`` backend the same objects from Prometheus in a real install).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from local_cluster import ClusterHandle, stop_process
from local_cluster.objects import (
    claim_template,
    create_claim_template,
    delete_namespace,
    gpu_pod,
    new_namespace,
    wait_for,
)
from rose_common import names, promtext
from rose_common.forecast_api import ForecastResponse

HORIZONS = (600, 1800, 3600)
DEMAND_LEVEL = {"pool-a": 0.15, "pool-b": 0.85}  # share of the pool's GPUs serving keeps busy


def forecasts(h: ClusterHandle, now: float) -> list[ForecastResponse]:
    """Fit the predictor's model on 14 days of generated demand per pool; forecast from now."""
    from predictor.generator import generate
    from predictor.model import ModelConfig, QuantileForecaster
    from predictor.service import PoolConfig, build_response

    step = 600
    start = int(now) - int(now) % step - 14 * 86400
    out = []
    for i, pool in enumerate(sorted(set(h.pools.values()))):
        capacity = h.gpus_per_node * sum(1 for p in h.pools.values() if p == pool)
        series = generate(14, step, seed=11 + i, level=DEMAND_LEVEL.get(pool, 0.5) * capacity, start=start)
        cfg = ModelConfig(horizons=HORIZONS, quantiles=(0.5, 0.9))
        model = QuantileForecaster(cfg).fit(series)
        last = series.start + (len(series) - 1) * series.step
        out.append(
            build_response(
                PoolConfig(name=pool, query="demo", capacity=capacity), series, model, "demo-1", float(last),
                list(HORIZONS), cfg.quantiles, max_data_age=3600.0,
            )
        )  # fmt: skip
    return out


def _ready(host: str, port: int) -> bool:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=1)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def _metrics(host: str, port: int, prefix: str) -> list[str]:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return [ln for ln in text.splitlines() if ln.startswith(prefix) and not ln.endswith(" 0.0")]


def _node(core: Any, ns: str, pod: str) -> str | None:
    node: str | None = core.read_namespaced_pod(pod, ns).spec.node_name
    return node


def act_lend_by_forecast(h: ClusterHandle, api: Any, say: Callable[[str], None]) -> bool:
    """Returns True when every worker landed in the pool forecast idle longest."""
    from kubernetes import client

    if not h.extender_url:
        say("   · (skipped: this cluster's rose-scheduler profile has no extender)")
        return True
    core = client.CoreV1Api(api)
    fcs = forecasts(h, time.time())
    say(f"   {'POOL':<8}{'GPUS':>5}{'NOW':>7}   {'p90 +10m':>9}{'p90 +30m':>9}{'p90 +60m':>9}")
    for f in fcs:
        cap = h.gpus_per_node * sum(1 for p in h.pools.values() if p == f.pool)
        p90 = [pt.quantiles["0.9"] for pt in f.points]
        say(f"   {f.pool:<8}{cap:>5}{f.current or 0:>7.1f}   " + "".join(f"{v:>9.1f}" for v in p90))
    quiet = min(fcs, key=lambda f: max(pt.quantiles["0.9"] for pt in f.points)).pool

    tmp = Path(tempfile.mkdtemp(prefix="rose-demo-ext-"))
    (tmp / "forecasts.json").write_text(json.dumps({"forecasts": [json.loads(f.model_dump_json()) for f in fcs]}))
    url = urlparse(h.extender_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    log = (tmp / "extender.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "scheduler_extender", f"--listen={host}:{port}", f"--kubeconfig={h.kubeconfig}",
            "--forecast-backend=static-file", f"--forecast-file={tmp / 'forecasts.json'}", "--forecast-refresh=1",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ns = ""
    try:
        wait_for("extender ready", lambda: proc.poll() is None and _ready(host, port), timeout=60)
        time.sleep(1.5)  # one forecast refresh
        say(f"   · `rose extender` serving {h.extender_url} for the rose-scheduler profile (watch-fed node cache)")
        ns = new_namespace(api, "demo-lend")
        create_claim_template(api, ns, claim_template("lendable-1", names.DEVICE_CLASS_LENDABLE))
        workers = 4
        for i in range(workers):
            pod = gpu_pod(
                f"grpo-worker-{i}", "lendable-1", scheduler=names.SCHEDULER_NAME,
                labels={names.LABEL_JOB: "grpo"}, priority_class="rose-rl",
            )  # fmt: skip
            core.create_namespaced_pod(ns, pod)
        placed: dict[str, str] = {}
        for i in range(workers):
            name = f"grpo-worker-{i}"
            placed[name] = wait_for(f"{name} bound", partial(_node, core, ns, name), timeout=90)
        ok = all(h.pools[n] == quiet for n in placed.values())
        for name, node in placed.items():
            say(f"   · {name} (lendable GPU) → {node} ({h.pools[node]})")
        say(f"   · every worker in {quiet}, the pool forecast idle longest: {'yes' if ok else 'NO'}")
        for line in _metrics(host, port, "rose_extender_prioritize_calls_total"):
            say(f"     {line}")
        text = "\n".join(_metrics(host, port, "rose_extender_"))
        cached = {
            sample.labels["kind"]: int(sample.value) for sample in promtext.samples(text, "rose_extender_cache_objects")
        }
        restarts = promtext.value(text, "rose_extender_watch_restarts_total", default=0.0)
        say(
            "   · extender cache, fed by watches: "
            + ", ".join(f"{n} {k}s" for k, n in sorted(cached.items()))
            + f" (bound pods only); watch restarts: {restarts:g}"
        )
        return ok
    finally:
        if ns:
            delete_namespace(api, ns)
        stop_process(proc)
        log.close()
