"""rose_common.promtext: samples by name and labels, histogram quantiles as PromQL computes them,
checked against a real prometheus_client registry's exposition."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rose_common import promtext


def _exposition() -> str:
    reg = CollectorRegistry()
    c = Counter("rose_x_calls", "calls", ["verb", "code"], registry=reg)
    c.labels("filter", "200").inc(3)
    c.labels("filter", "500").inc(1)
    c.labels("prioritize", "200").inc(5)
    Gauge("rose_x_cache_objects", "objects", ["kind"], registry=reg).labels('Pod "quoted" ').set(7)
    h = Histogram("rose_x_seconds", "latency", ["verb"], buckets=(0.001, 0.01, 0.1), registry=reg)
    for v in (0.0005,) * 50 + (0.005,) * 40 + (0.05,) * 9 + (5.0,):
        h.labels("filter").observe(v)
    return generate_latest(reg).decode()


def test_value_selects_by_name_and_label_subset_and_sums() -> None:
    text = _exposition()
    assert promtext.value(text, "rose_x_calls_total", {"verb": "filter", "code": "200"}) == 3
    assert promtext.value(text, "rose_x_calls_total", {"verb": "filter"}) == 4
    assert promtext.value(text, "rose_x_calls_total") == 9
    assert promtext.value(text, "rose_x_cache_objects", {"kind": 'Pod "quoted" '}) == 7, "escaped label values"
    assert promtext.value(text, "rose_x_calls_total", {"verb": "preempt"}, default=0.0) == 0.0
    with pytest.raises(promtext.MetricNotFound, match=r'rose_x_calls_total\{verb="preempt"\}'):
        promtext.value(text, "rose_x_calls_total", {"verb": "preempt"})
    assert [s.labels["code"] for s in promtext.samples(text, "rose_x_calls_total", {"verb": "filter"})] == [
        "200",
        "500",
    ]


def test_histogram_quantile_like_promql() -> None:
    cumulative = promtext.buckets(_exposition(), "rose_x_seconds", {"verb": "filter"})
    assert cumulative == [(0.001, 50.0), (0.01, 90.0), (0.1, 99.0), (math.inf, 100.0)]
    assert promtext.histogram_quantile(0.5, cumulative) == pytest.approx(0.001)
    assert promtext.histogram_quantile(0.7, cumulative) == pytest.approx(0.001 + 0.009 * 0.5)
    assert promtext.histogram_quantile(0.25, cumulative) == pytest.approx(0.0005)
    assert promtext.histogram_quantile(0.995, cumulative) == 0.1, "the +Inf bucket gives the highest finite bound"
    assert math.isnan(promtext.histogram_quantile(0.5, []))
    with pytest.raises(ValueError, match="quantile"):
        promtext.histogram_quantile(1.5, cumulative)
