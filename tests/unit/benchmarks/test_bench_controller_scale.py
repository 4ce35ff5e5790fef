"""The pure helpers of ``benchmarks.controller_scale``
(the run itself: tests/e2e/benchmarks/test_controller_scale_bench.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import controller_scale as cs
from rose_common.forecast_api import ForecastResponse


def test_forecast_file_is_what_the_static_file_backend_reads(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    cs.write_forecasts(path, {"pool-b": 0.0, "pool-a": 32.0})
    docs = [ForecastResponse.model_validate(d) for d in json.loads(path.read_text())["forecasts"]]
    assert [d.pool for d in docs] == ["pool-a", "pool-b"]
    assert {p.quantiles["0.9"] for p in docs[0].points} == {32.0} and not path.with_suffix(".tmp").exists()


def test_histogram_difference_and_quantiles() -> None:
    before = [(0.1, 10.0), (1.0, 10.0), (math.inf, 10.0)]
    after = [(0.1, 10.0), (1.0, 30.0), (math.inf, 30.0)]
    d = cs.diff(after, before)
    assert d == [(0.1, 0.0), (1.0, 20.0), (math.inf, 20.0)]
    q = cs.quantiles_ms(d)
    assert q["count"] == 20 and 100 < q["p50_ms"] < q["p95_ms"] <= 1000
    assert cs.quantiles_ms([]) == {"count": 0.0}


def test_bad_sizes_are_refused_with_what_to_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cs.main(["--jobs", "0"])
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cs.main(["--jobs", "200", "--nodes", "10"])
    assert "GPUs exceed --nodes x 8" in capsys.readouterr().err


def test_worker_names_map_back_to_their_job() -> None:
    assert cs._job_of("job-0007-w3") == "job-0007" and cs._job_of("a-w-b-w12") == "a-w-b"


def test_apiserver_writes_by_kind_and_the_window_between_two_scrapes() -> None:
    def page(patch_pods: int, leases: int) -> str:
        return "\n".join(
            [
                "# TYPE apiserver_request_total counter",
                f'apiserver_request_total{{code="200",resource="pods",subresource="",verb="PATCH"}} {patch_pods}',
                'apiserver_request_total{code="409",resource="pods",subresource="",verb="PATCH"} 1',
                f'apiserver_request_total{{code="200",resource="leases",subresource="",verb="PUT"}} {leases}',
                'apiserver_request_total{code="200",resource="pods",subresource="status",verb="PUT"} 7',
                'apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 99',
                'apiserver_request_duration_seconds_count{verb="PATCH"} 5',
            ]
        )

    before, after = cs.apiserver_writes(page(10, 5)), cs.apiserver_writes(page(410, 25))
    assert before == {"PATCH pods": 11.0, "PUT leases": 5.0, "PUT pods/status": 7.0}  # reads are not writes
    w = cs.writes_between(before, after, 10.0)
    assert w == {"total": 420, "per_s": 42.0, "by_kind": {"PATCH pods": 400, "PUT leases": 20}}
