"""The helpers the benchmark scripts share (``benchmarks._common``) and the extender histogram
quantiles of ``benchmarks.scheduler_throughput`` built on them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import _common, scheduler_throughput

EXPOSITION = """# TYPE rose_extender_request_duration_seconds histogram
rose_extender_request_duration_seconds_bucket{verb="filter",le="0.001"} 40.0
rose_extender_request_duration_seconds_bucket{verb="filter",le="0.01"} 90.0
rose_extender_request_duration_seconds_bucket{verb="filter",le="+Inf"} 100.0
rose_extender_request_duration_seconds_sum{verb="filter"} 0.5
rose_extender_request_duration_seconds_count{verb="filter"} 100.0
"""


def test_quantiles_interpolate_inside_a_bucket_at_the_asked_precision() -> None:
    cumulative = [(0.001, 40.0), (0.01, 90.0), (math.inf, 100.0)]
    assert _common.quantiles_ms(cumulative, (0.5,), 3) == {"count": 100.0, "p50_ms": 2.8}  # 1 + 9 * 10/50 ms
    assert _common.quantiles_ms(cumulative) == {"count": 100.0, "p50_ms": 2.8, "p95_ms": 10.0}
    assert _common.quantiles_ms([]) == {"count": 0.0}


def test_scheduler_throughput_reads_p50_and_p99_of_a_verb() -> None:
    assert scheduler_throughput.histogram_quantiles(EXPOSITION, "filter") == {
        "count": 100.0,
        "p50_ms": 2.8,
        "p99_ms": 10.0,
    }
    assert scheduler_throughput.histogram_quantiles(EXPOSITION, "preempt") == {"count": 0.0}


def test_the_json_report_goes_to_stdout_and_only_an_asked_for_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _common.emit_json({"a": 1}, None)
    assert json.loads(capsys.readouterr().out) == {"a": 1} and not list(tmp_path.iterdir())
    _common.emit_json({"a": 1}, tmp_path / "r.json")
    assert (tmp_path / "r.json").read_text() == '{\n "a": 1\n}\n'
    _common.write_json(tmp_path / "w.json", [1], indent=2)
    assert (tmp_path / "w.json").read_text() == "[\n  1\n]\n"
