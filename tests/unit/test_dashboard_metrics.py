"""Every query of the Grafana dashboard names metrics that the components really export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

DASHBOARD = Path(__file__).resolve().parents[2] / "manifests" / "grafana" / "slo-vs-rl-throughput.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def _exported(obj: Any) -> set[str]:
    names: set[str] = set()
    for value in vars(obj).values():
        if isinstance(value, MetricWrapperBase):
            for fam in value.describe():
                for suffix in _SUFFIXES.get(fam.type, ("",)):
                    names.add(fam.name + suffix)
    return names


def exported_metric_names() -> set[str]:
    from dra_driver.metrics import DriverMetrics
    from dra_driver.suspend.metrics import SuspendMetrics
    from predictor.metrics import PredictorMetrics
    from scheduler_extender.metrics import ExtenderMetrics

    names: set[str] = set()
    names |= _exported(DriverMetrics([0, 1], registry=CollectorRegistry()))
    names |= _exported(SuspendMetrics(registry=CollectorRegistry()))
    names |= _exported(ExtenderMetrics())
    names |= _exported(PredictorMetrics(["pool-a"], [600], [0.9]))
    return names


def dashboard_metric_names() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\brose_[a-z0-9_]+", target["expr"]))
    return used


def test_dashboard_is_provisionable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "rose-slo-vs-rl" and dash["title"] == "SLO vs RL throughput"
    assert "__inputs" not in dash and "${DS_" not in DASHBOARD.read_text()
    assert any(v["name"] == "datasource" and v["type"] == "datasource" for v in dash["templating"]["list"])


def test_every_dashboard_query_names_an_exported_metric() -> None:
    exported = exported_metric_names()
    used = dashboard_metric_names()
    assert used, "the dashboard has no queries"
    missing = sorted(used - exported)
    assert not missing, f"dashboard queries name metrics no component exports: {missing}"


def test_all_metrics_carry_the_rose_prefix() -> None:
    assert all(n.startswith("rose_") for n in exported_metric_names())
