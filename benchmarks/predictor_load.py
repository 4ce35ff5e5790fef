"""Bounded load test of the predictor's HTTP server on loopback: concurrent clients, fixed count.

    python -m benchmarks.predictor_load [--clients 64] [--requests 20] [--json OUT.json]

Each of ``--clients`` threads opens a new connection for every one of its ``--requests``
``GET /v1/forecast`` calls (the case a short listen backlog breaks: connects pile up at once),
all released together by a barrier. Counted: answers by status, connection errors (reset,
refused, timeout) and the client-side latency (connect to last body byte). Pass: every answer
200, no connection error. The server runs in this process on a replayed generated series.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from predictor.generator import generate
from predictor.model import ModelConfig
from predictor.replay import ReplaySource
from predictor.server import PredictorHTTPServer, serve_in_thread
from predictor.service import PoolConfig, PredictorService, Settings
from predictor.store import ModelStore


@dataclass
class LoadResult:
    clients: int
    requests: int
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        lat = np.asarray(self.latencies_ms or [0.0])
        return {
            "clients": self.clients,
            "requests": self.requests,
            "seconds": round(self.seconds, 2),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "errors": dict(self.errors),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "max_ms": round(float(lat.max()), 2),
        }


def _client(
    host: str, port: int, path: str, n: int, start: threading.Barrier, out: LoadResult, lock: threading.Lock
) -> None:
    start.wait()
    for _ in range(n):
        t = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            with lock:
                out.errors[type(e).__name__] += 1
            continue
        with lock:
            out.statuses[r.status] += 1
            out.latencies_ms.append((time.perf_counter() - t) * 1000)


def run_load(url_host: str, port: int, path: str, clients: int = 64, requests: int = 20) -> LoadResult:
    """``clients`` threads, each ``requests`` new-connection GETs of ``path``, all started at once."""
    out, lock = LoadResult(clients, clients * requests), threading.Lock()
    start = threading.Barrier(clients + 1)
    threads = [
        threading.Thread(target=_client, args=(url_host, port, path, requests, start, out, lock), daemon=True)
        for _ in range(clients)
    ]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=120)
    out.seconds = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20, help="requests per client")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    series = generate(3, 600, seed=7)
    settings = Settings(step=600, history=3 * 86400, model=ModelConfig(horizons=(1800,), max_iter=20))
    with tempfile.TemporaryDirectory() as d:
        pools = [PoolConfig(name="pool-a", query="replay", capacity=128)]
        svc = PredictorService(pools, ReplaySource(series), settings, ModelStore(Path(d)))
        svc.refresh()
        srv = PredictorHTTPServer(("127.0.0.1", 0), svc)
        serve_in_thread(srv)
        try:
            res = run_load("127.0.0.1", srv.server_address[1], "/v1/forecast?pool=pool-a", a.clients, a.requests)
        finally:
            srv.shutdown()
            srv.server_close()
    summary = res.summary()
    print(json.dumps(summary))
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1) + "\n")
    ok = not res.errors and set(res.statuses) == {200} and sum(res.statuses.values()) == res.requests
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
