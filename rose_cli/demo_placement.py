"""Demo act: lend by forecast. The predictor's model forecasts serving demand per pool; the
scheduler extender, called over HTTP by the real kube-scheduler (profile ``rose-scheduler``),
places an ElasticRLJob's workers where serving is forecast to leave the most room.

Demand comes from the predictor's embedded generator (one quiet pool, one busy pool), fitted
with the predictor's real quantile model in this process; its ForecastResponse objects reach the
extender through the extender's explicit ``static-file`` forecast backend (``rose predictor
serve`` feeds the ``http`` backend the same objects from Prometheus in a real install).

The forecast is made at a fixed origin of the generated history (:data:`ORIGIN`), never at the
wall clock: the generator has a daily cycle, so a forecast from "now" gave a different act at
every hour of the day. I/O: the cluster's API (pods, claim templates), the extender process it
starts and that process's ``/metrics``; :func:`forecasts` is pure (no clock, no I/O).
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import tempfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from local_cluster import ClusterHandle, module_process
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
# The forecast origin: Monday 2025-12-01 12:00 UTC, the end of 14 generated days (the last
# observation is one step before it, as when the demo forecast from the wall clock). At this hour
# the busy pool still fits a worker for the whole horizon, with little room to spare (p90 about
# 13 of 16 GPUs) while the quiet one has about 12 GPUs spare: both pools tie on the idle
# window and only headroom tells them apart — the case the act shows.
ORIGIN = 1_764_590_400
HISTORY_DAYS = 14
STEP = 600


def capacities(pools: Mapping[str, str], gpus_per_node: int) -> dict[str, int]:
    """Physical GPUs per pool, from the node → pool map."""
    out: dict[str, int] = {}
    for pool in pools.values():
        out[pool] = out.get(pool, 0) + gpus_per_node
    return dict(sorted(out.items()))


def forecasts(pools: Mapping[str, str], gpus_per_node: int, origin: int = ORIGIN) -> list[ForecastResponse]:
    """Fit the predictor's model on 14 generated days per pool ending at ``origin``; forecast
    from there. Pure: the same arguments give the same forecasts at any time of day."""
    from predictor.generator import generate
    from predictor.model import ModelConfig, QuantileForecaster
    from predictor.service import PoolConfig, build_response

    step = STEP
    start = origin - origin % step - HISTORY_DAYS * 86400
    out = []
    for i, (pool, capacity) in enumerate(capacities(pools, gpus_per_node).items()):
        series = generate(HISTORY_DAYS, step, seed=11 + i, level=DEMAND_LEVEL.get(pool, 0.5) * capacity, start=start)
        cfg = ModelConfig(horizons=HORIZONS, quantiles=(0.5, 0.9))
        model = QuantileForecaster(cfg).fit(series)
        last = series.start + (len(series) - 1) * series.step
        out.append(
            build_response(
                PoolConfig(name=pool, query="demo", capacity=capacity),
                series,
                model,
                "demo-1",
                float(last),
                list(HORIZONS),
                cfg.quantiles,
                max_data_age=3600.0,
            )
        )
    return out


def show_forecasts(fcs: list[ForecastResponse], caps: Mapping[str, int], say: Callable[[str], None]) -> str:
    """Print the forecast table; return the pool with the most GPUs spare at p90 over the horizon."""
    last = fcs[0].last_observation_at if fcs else None
    when = last.strftime("%a %Y-%m-%d %H:%M UTC") if last else "-"
    say(f"   forecast from {when}, a fixed point of the generated history (the same act at any hour)")
    say(f"   {'POOL':<8}{'GPUS':>5}{'NOW':>7}   {'p90 +10m':>9}{'p90 +30m':>9}{'p90 +60m':>9}{'LEAST SPARE':>13}")
    spare: dict[str, float] = {}
    for f in fcs:
        p90 = [pt.quantiles["0.9"] for pt in f.points]
        spare[f.pool] = caps[f.pool] - max(p90)
        say(
            f"   {f.pool:<8}{caps[f.pool]:>5}{f.current or 0:>7.1f}   "
            + "".join(f"{v:>9.1f}" for v in p90)
            + f"{spare[f.pool]:>13.1f}"
        )
    return max(spare, key=lambda p: spare[p])


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
    """Returns True when every worker landed in the pool forecast to leave the most room."""
    from kubernetes import client

    if not h.extender_url:
        say("   · (skipped: this cluster's rose-scheduler profile has no extender)")
        return True
    core = client.CoreV1Api(api)
    fcs = forecasts(h.pools, h.gpus_per_node)
    quiet = show_forecasts(fcs, capacities(h.pools, h.gpus_per_node), say)

    tmp = Path(tempfile.mkdtemp(prefix="rose-demo-ext-"))
    # the forecast is from now on: the extender counts a reply's horizons from its generated_at
    now = dt.datetime.now(dt.UTC)
    fresh = [f.model_copy(update={"generated_at": now}) for f in fcs]
    (tmp / "forecasts.json").write_text(json.dumps({"forecasts": [json.loads(f.model_dump_json()) for f in fresh]}))
    url = urlparse(h.extender_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    args = [
        "scheduler_extender",
        f"--listen={host}:{port}",
        f"--kubeconfig={h.kubeconfig}",
        "--forecast-backend=static-file",
        f"--forecast-file={tmp / 'forecasts.json'}",
        "--forecast-refresh=1",
    ]
    with module_process(args, tmp / "extender.log") as proc:
        ns = ""
        try:
            # ready = its cache synced and every pool's forecast fetched (no call decides on a fallback)
            wait_for("extender ready", lambda: proc.poll() is None and _ready(host, port), timeout=60)
            say(f"   · `rose extender` serving {h.extender_url} for the rose-scheduler profile (watch-fed node cache)")
            ns = new_namespace(api, "demo-lend")
            create_claim_template(api, ns, claim_template("lendable-1", names.DEVICE_CLASS_LENDABLE))
            workers = 4
            for i in range(workers):
                pod = gpu_pod(
                    f"grpo-worker-{i}",
                    "lendable-1",
                    scheduler=names.SCHEDULER_NAME,
                    labels={names.LABEL_JOB: "grpo"},
                    priority_class="rose-rl",
                )
                core.create_namespaced_pod(ns, pod)
            placed: dict[str, str] = {}
            for i in range(workers):
                name = f"grpo-worker-{i}"
                placed[name] = wait_for(f"{name} bound", partial(_node, core, ns, name), timeout=90)
            ok = all(h.pools[n] == quiet for n in placed.values())
            for name, node in placed.items():
                say(f"   · {name} (lendable GPU) → {node} ({h.pools[node]})")
            say(f"   · every worker in {quiet}, the pool forecast to leave the most room: {'yes' if ok else 'NO'}")
            for line in _metrics(host, port, "rose_extender_prioritize_calls_total"):
                say(f"     {line}")
            text = "\n".join(_metrics(host, port, "rose_extender_"))
            cached = {
                sample.labels["kind"]: int(sample.value)
                for sample in promtext.samples(text, "rose_extender_cache_objects")
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
