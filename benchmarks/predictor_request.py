"""Latency of ``GET /v1/forecast`` over real HTTP on loopback (keep-alive), client-side.

    python -m benchmarks.predictor_request [--requests 5000] [--json OUT.json]

Goal (issue 5): p99 at most 10 ms. The server runs in this process with a replayed generated
series (no Prometheus needed); one refresh computes the cached forecast, then requests only
read it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._common import emit_json
from predictor.generator import generate
from predictor.model import ModelConfig
from predictor.replay import ReplaySource
from predictor.server import PredictorHTTPServer, serve_in_thread
from predictor.service import PoolConfig, PredictorService, Settings
from predictor.store import ModelStore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    series = generate(14, 60, seed=7)
    settings = Settings(step=60, history=14 * 86400, risks=(0.01, 0.05), model=ModelConfig(horizons=(600, 1800, 3600)))
    with tempfile.TemporaryDirectory() as d:
        svc = PredictorService(
            [PoolConfig(name="pool-a", query="replay", capacity=128, capacity_per_gpu=1.0)],
            ReplaySource(series),
            settings,
            ModelStore(Path(d)),
        )
        t0 = time.perf_counter()
        svc.refresh()
        refresh_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        svc.refresh()  # no fit due: ingest + forecasts incl. the online-calibrated window-max bounds
        refresh_no_fit_s = time.perf_counter() - t0
        srv = PredictorHTTPServer(("127.0.0.1", 0), svc)
        serve_in_thread(srv)
        host, port = srv.server_address[:2]
        conn = http.client.HTTPConnection(str(host), int(port), timeout=5)
        lat = []
        paths = ["/v1/forecast?pool=pool-a&horizon=30m", "/v1/forecast?pool=pool-a"]
        for i in range(a.requests + 200):
            t = time.perf_counter()
            conn.request("GET", paths[i % 2])
            r = conn.getresponse()
            body = r.read()
            dt = time.perf_counter() - t
            assert r.status == 200, body
            if i >= 200:  # warm-up
                lat.append(dt * 1000)
        point = json.loads(body)["points"][0]
        assert point["window_max"] and point["gpus_needed"], point  # the reply carries the bounds
        conn.close()
        srv.shutdown()
        srv.server_close()
    arr = np.asarray(lat)
    out = {
        "requests": len(lat),
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
        "max_ms": float(arr.max()),
        "mean_ms": statistics.fmean(lat),
        "refresh_with_fit_seconds": refresh_s,
        "refresh_without_fit_seconds": refresh_no_fit_s,
        "goal_p99_ms": 10.0,
        "goal_met": float(np.percentile(arr, 99)) <= 10.0,
    }
    emit_json(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
