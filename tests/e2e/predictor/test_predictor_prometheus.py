"""End to end with a real Prometheus (Debian's ``prometheus`` package).

History: the real ServeGen m-large trace (14 days at 10 minutes), time-compressed 600x (one
10-minute window per second), loaded into Prometheus's TSDB with ``promtool tsdb
create-blocks-from openmetrics``. Live: a replay exporter serves the next rows of the trace,
one per second, and Prometheus scrapes it every second. The predictor runs as its own process
(``python -m predictor serve``), ingests through prometheus-api-client and serves forecasts;
then Prometheus is stopped and the forecast must turn ``stale`` with the pool's capacity.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_cluster import free_port, stop_process
from predictor.series import read_series_csv
from rose_common.forecast_api import ForecastResponse
from tests.support.predictor_fixtures import REPO, traces_dir
from tests.support.prometheus_fixtures import PROMETHEUS, MetricsStandIn, prometheus

PROMTOOL = "/usr/bin/promtool"
SCALE = 5000.0  # requests per 10 minutes → "busy GPUs" (about 6..70)
HISTORY_ROWS = 1200  # backfilled; the replay continues from there
CAPACITY = 96


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class _Replay(MetricsStandIn):
    """A replay exporter: row ``k0 + (now - t0)`` of the trace, as a Prometheus gauge."""

    def __init__(self, values: np.ndarray, t0: float, k0: int) -> None:
        self.values, self.t0, self.k0 = values, t0, k0
        super().__init__(self.render)

    def render(self) -> str:
        v = self.values[min(len(self.values) - 1, self.k0 + int(time.time() - self.t0))]
        return (
            "# HELP rose_serving_busy_gpus Busy serving GPUs (replayed trace).\n"
            "# TYPE rose_serving_busy_gpus gauge\n"
            f'rose_serving_busy_gpus{{pool="pool-a"}} {v:.6f}\n'
        )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    assert Path(PROMETHEUS).exists() and Path(PROMTOOL).exists(), (
        "Debian's prometheus package is required: apt-get install -y prometheus"
    )
    trace = read_series_csv(traces_dir() / "derived" / "servegen_m-large_10min.csv")
    values = np.nan_to_num(trace.values / SCALE, nan=0.0)
    t0 = float(int(time.time()))
    replay = _Replay(values, t0, HISTORY_ROWS)
    # the backfilled series carries the labels the scrape adds, so history and live are one series
    labels = f'pool="pool-a",job="replay",instance="127.0.0.1:{replay.port}"'
    # backfill rows 0..HISTORY_ROWS-1 at one second apiece, ending just before t0
    om = tmp_path / "history.om"
    lines = [
        "# HELP rose_serving_busy_gpus Busy serving GPUs (replayed trace).",
        "# TYPE rose_serving_busy_gpus gauge",
    ]
    for k in range(HISTORY_ROWS):
        ts = t0 - HISTORY_ROWS + k
        lines.append(f"rose_serving_busy_gpus{{{labels}}} {values[k]:.6f} {ts:.0f}")
    lines.append("# EOF")
    om.write_text("\n".join(lines) + "\n")
    data = tmp_path / "tsdb"
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cfg = (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: replay\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{replay.port}']\n"
    )
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        'pools:\n  - name: pool-a\n    query: sum(rose_serving_busy_gpus{pool="pool-a"})\n'
        f"    unit: gpus\n    capacity: {CAPACITY}\n    capacity_per_gpu: {CAPACITY / 64}\n"
    )
    port = free_port()
    try:
        with prometheus(cfg, tmp_path, tsdb=data, extra=["--storage.tsdb.retention.time=30d"]) as prom:
            env = {**os.environ, "ROSE_PREDICTOR_PROMETHEUS_URL": prom.url, "PYTHONPATH": str(REPO)}
            with (tmp_path / "predictor.log").open("w") as pred_log:
                pred = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "predictor",
                        "serve",
                        "--pools",
                        str(pools),
                        "--listen",
                        f"127.0.0.1:{port}",
                        "--step",
                        "1s",
                        "--history",
                        "1h",
                        "--horizons",
                        "10s,30s,60s",
                        "--quantiles",
                        "0.9",
                        "--risks",
                        "0.05",
                        "--refresh-interval",
                        "1s",
                        "--max-data-age",
                        "8s",
                        "--season-day",
                        "144s",
                        "--season-week",
                        "1008s",
                        "--model-dir",
                        str(tmp_path / "models"),
                    ],
                    env=env,
                    cwd=REPO,
                    stdout=pred_log,
                    stderr=subprocess.STDOUT,
                )
                try:
                    yield {
                        "prom": prom.proc,
                        "prom_url": prom.url,
                        "url": f"http://127.0.0.1:{port}",
                        "tmp": tmp_path,
                        "values": values,
                        "t0": t0,
                    }
                finally:
                    stop_process(pred)
    finally:
        replay.close()
        for name in ("prometheus.log", "predictor.log"):
            with contextlib.suppress(OSError):
                print(f"--- {name} (tail)\n" + (tmp_path / name).read_text()[-3000:])


def test_forecasts_from_a_real_prometheus(stack: dict[str, Any]) -> None:
    # Prometheus serves the backfilled history
    def history_loaded() -> bool:
        q = urllib.parse.quote('count_over_time(rose_serving_busy_gpus{pool="pool-a"}[30m])')
        code, body = _get(f"{stack['prom_url']}/api/v1/query?query={q}")
        res = body.get("data", {}).get("result", []) if code == 200 else []
        return bool(res) and float(res[0]["value"][1]) > 1000

    _wait(history_loaded, 60, "Prometheus to load the backfilled history")

    def fresh_forecast() -> ForecastResponse | None:
        code, body = _get(stack["url"] + "/v1/forecast?pool=pool-a")
        if code != 200:
            return None
        r = ForecastResponse.model_validate(body)
        return r if not r.stale else None

    r = _wait(fresh_forecast, 120, "a fresh (non-stale) forecast from the predictor")
    assert r.pool == "pool-a" and r.unit == "gpus"
    assert [p.horizon_seconds for p in r.points] == [10, 30, 60]
    assert r.data_age_seconds is not None and r.data_age_seconds <= 8
    assert r.model_version.startswith("pool-a-")
    assert (stack["tmp"] / "models" / "pool-a" / f"{r.model_version}.pkl").exists()
    # the current value is one the replay served (history or live)
    assert r.current is not None
    assert np.min(np.abs(stack["values"] - r.current)) < 1e-3
    for p in r.points:
        assert 0 < p.quantiles["0.5"] <= p.quantiles["0.9"] < CAPACITY
        assert p.timestamp.timestamp() > r.generated_at.timestamp() - 8
        # the window-max bound at the served risk, and the GPUs it takes
        assert p.window_max is not None and p.gpus_needed is not None
        assert p.window_max["0.05"] >= r.current * 0.5
        assert p.gpus_needed["0.05"] == math.ceil(p.window_max["0.05"] / (CAPACITY / 64) - 1e-9)
    # the same numbers as Prometheus gauges
    with urllib.request.urlopen(stack["url"] + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'rose_forecast_demand{horizon="30s",pool="pool-a",quantile="0.9"}' in text
    assert 'rose_forecast_ingest_total{pool="pool-a",result="ok"}' in text
    assert 'rose_forecast_window_max{horizon="30s",pool="pool-a",risk="0.05"}' in text

    # Prometheus goes away: the predictor keeps serving, and the answer turns stale + safe bound
    stack["prom"].terminate()
    stack["prom"].wait(timeout=20)

    def stale_forecast() -> ForecastResponse | None:
        code, body = _get(stack["url"] + "/v1/forecast?pool=pool-a&horizon=30s")
        r = ForecastResponse.model_validate(body) if code == 200 else None
        return r if r is not None and r.stale else None

    s = _wait(stale_forecast, 60, "the forecast to turn stale once Prometheus is gone")
    assert s.points[0].quantiles == {"0.5": float(CAPACITY), "0.9": float(CAPACITY)}
    assert s.points[0].window_max == {"0.05": float(CAPACITY)} and s.points[0].gpus_needed == {"0.05": 64}
    assert s.data_age_seconds is not None and s.data_age_seconds > 8


def test_prometheus_binaries_are_the_distributions() -> None:
    assert shutil.which("prometheus") == PROMETHEUS
    out = subprocess.run([PROMETHEUS, "--version"], check=False, capture_output=True, text=True, timeout=30)
    assert "prometheus, version" in (out.stdout + out.stderr)
