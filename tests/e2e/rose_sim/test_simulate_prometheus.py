"""``rose simulate --prometheus`` against a real Prometheus (Debian's ``prometheus`` package).

Three days of the real ServeGen m-large trace (10-minute points, two of them removed as
collection holes) are backfilled into Prometheus's TSDB with ``promtool tsdb create-blocks-from
openmetrics`` as ``rose_serving_demand{pool="a"}``, next to a second series (``pool="b"``). The
same rows are written as a CSV in the traces' format. ``rose simulate`` run on the CSV and on the
range query (through the predictor's ingestion) must give the same report, every policy and
figure, the predictor's model in the loop; bad Prometheus input is one line and exit status 2.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_cluster import free_port
from predictor.series import read_series_csv
from rose_sim.cli import main as sim_main
from tests.support.predictor_fixtures import REPO, traces_dir
from tests.support.prometheus_fixtures import PROMETHEUS, prometheus

PROMTOOL = "/usr/bin/promtool"
BASE = 1_764_547_200  # 2025-12-01T00:00:00Z, a multiple of the step
STEP = 600
ROWS = 432  # three days
GAPS = (200, 301)  # collection holes: absent from Prometheus, empty in the CSV
JOBS = REPO / "docs" / "simulate-jobs"
COMMON = ["--jobs", str(JOBS), "--history", "1d", "--forecasters", "oracle,baseline,model"]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    assert Path(PROMETHEUS).exists() and Path(PROMTOOL).exists(), (
        "Debian's prometheus package is required: apt-get install -y prometheus"
    )
    tmp = tmp_path_factory.mktemp("simprom")
    values = read_series_csv(traces_dir() / "derived" / "servegen_m-large_10min.csv").values[:ROWS].copy()
    values[list(GAPS)] = np.nan
    csv = tmp / "m-large-3d.csv"
    csv.write_text(
        "t_seconds,requests_per_10min\n"
        + "".join(f"{BASE + i * STEP},{'' if math.isnan(v) else repr(float(v))}\n" for i, v in enumerate(values))
    )
    lines = ["# HELP rose_serving_demand Serving demand (requests per 10 min).", "# TYPE rose_serving_demand gauge"]
    for i, v in enumerate(values):
        if not math.isnan(v):
            lines.append(f'rose_serving_demand{{pool="a"}} {float(v)!r} {BASE + i * STEP}')
            lines.append(f'rose_serving_demand{{pool="b"}} {float(v) / 2!r} {BASE + i * STEP}')
    lines.append("# EOF")
    (tmp / "history.om").write_text("\n".join(lines) + "\n")
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"), str(tmp / "tsdb")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cfg = "global:\n  scrape_interval: 1m\nscrape_configs: []\n"
    with prometheus(cfg, tmp, tsdb=tmp / "tsdb", extra=["--storage.tsdb.retention.time=3650d"]) as prom:
        deadline = time.monotonic() + 120
        while not _ready(prom.url):
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.3)
        yield {"url": prom.url, "csv": csv, "tmp": tmp}


QUERY = 'rose_serving_demand{pool="a"}'
END = BASE + (ROWS - 1) * STEP


def _prom_args(url: str, query: str = QUERY, end: int = END) -> list[str]:
    return ["--prometheus", url, "--query", query, "--start", str(BASE), "--end", str(end), "--step", "10m"]


def _comparable(path: Path) -> dict[str, Any]:
    report = json.loads(path.read_text())
    for k in ("series", "runtime_s"):  # where the series came from; wall and CPU seconds
        report.pop(k)
    for r in report["results"].values():
        r.pop("plan_ms_mean")  # the planner's wall time per call
    return dict(report)


def test_the_prometheus_form_and_the_csv_form_give_the_same_simulation(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp = served["tmp"]
    assert sim_main(["--series", str(served["csv"]), *COMMON, "--json", str(tmp / "csv.json")]) == 0
    assert sim_main([*_prom_args(served["url"]), *COMMON, "--json", str(tmp / "prom.json")]) == 0
    from_csv, from_prom = _comparable(tmp / "csv.json"), _comparable(tmp / "prom.json")
    assert from_csv == from_prom
    # not vacuous: two days evaluated, RL got GPU-hours, the model was in the loop
    assert from_prom["evaluated_days"] == 2.0
    assert from_prom["results"]["planned-model"]["rl_useful_gpu_hours"] > 100
    assert "model" in from_prom["forecasters"]
    assert json.loads((tmp / "prom.json").read_text())["series"].startswith(f"prometheus {served['url']} ")
    # a shorter range is a different simulation (the comparison sees the data)
    assert sim_main([*_prom_args(served["url"], end=BASE + (ROWS - 2) * STEP), *COMMON,
                     "--json", str(tmp / "short.json")]) == 0  # fmt: skip
    assert _comparable(tmp / "short.json") != from_prom
    capsys.readouterr()


@pytest.mark.parametrize(
    ("query", "url", "expect"),
    [
        ("rose_serving_demand", None, "returned 2 series"),
        ("nothing_here", None, "returned no samples between 2025-12-01T00:00:00Z"),
        ("rate(", None, "range query to"),
        ('rose_serving_demand{pool="a"}', "closed", "range query to"),
    ],
)
def test_bad_prometheus_input_is_one_line(
    served: dict[str, Any], capsys: pytest.CaptureFixture[str], query: str, url: str | None, expect: str
) -> None:
    target = served["url"] if url is None else f"http://127.0.0.1:{free_port()}"
    assert sim_main([*_prom_args(target, query), *COMMON]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rose simulate: error: ") and expect in err, err
