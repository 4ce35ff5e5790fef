"""The "SLO vs RL throughput" dashboard: generated from rose_cli.dashboard_spec with the Grafana
Foundation SDK, every query parsed by Prometheus' own parser (promtool), and every metric it names
exported by a component or produced by a recording rule of manifests/prometheus/rules.yaml."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from rose_cli import dashboard, dashboard_spec
from tests.support.manifest_files import PROMETHEUS_RULES

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "manifests" / "grafana" / "slo-vs-rl-throughput.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# vLLM's metrics: the serving engine's own, named by the dashboard's variables
SERVING_ENGINE = re.compile(r"^vllm:")
RL_PROGRESS = {"rose_rl_steps_total", "rose_rl_samples_total", "rose_rl_tokens_total"}


def _names(registry: CollectorRegistry) -> set[str]:
    return {fam.name + s for fam in registry.collect() for s in _SUFFIXES.get(fam.type, ("",))}


def exported_metric_names() -> set[str]:
    from dra_driver.metrics import DriverMetrics
    from dra_driver.suspend.metrics import SuspendMetrics
    from elastic_controller.metrics import ControllerMetrics
    from predictor.metrics import PredictorMetrics
    from scheduler_extender.metrics import ExtenderMetrics
    from timeslice.metrics import TimesliceMetrics

    names = _names(DriverMetrics([0, 1], registry=CollectorRegistry()).registry)
    suspend_reg = CollectorRegistry()
    SuspendMetrics(registry=suspend_reg)
    names |= _names(suspend_reg) | _names(ExtenderMetrics().registry) | _names(ControllerMetrics().registry)
    names |= _names(PredictorMetrics(["pool-a"], [600], [0.9]).registry) | _names(TimesliceMetrics().registry)
    return names


def recorded_metric_names() -> set[str]:
    rules = yaml.safe_load(PROMETHEUS_RULES.read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def dashboard_metric_names() -> set[str]:
    used: set[str] = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = dashboard_spec.interpolate(target["expr"])
            used |= set(re.findall(r"\b(?:rose_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr))
    return used


def test_committed_json_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == dashboard.render(), "run `rose dashboard generate` and commit the JSON"


def test_dashboard_is_provisionable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "rose-slo-vs-rl" and dash["title"] == "SLO vs RL throughput"
    assert "__inputs" not in dash and "${DS_" not in DASHBOARD.read_text()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for name, default in [
        ("ttft_metric", "vllm:time_to_first_token_seconds"),
        ("e2e_metric", "vllm:e2e_request_latency_seconds"),
        ("queue_metric", "vllm:num_requests_waiting"),
    ]:
        assert variables[name]["current"]["value"] == default


def test_every_query_parses_with_prometheus_parser(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    rules = [
        {"record": f"dashboard:q{i}", "expr": dashboard_spec.interpolate(expr)}
        for i, (_, expr) in enumerate(dashboard_spec.all_queries())
    ]
    # the pool variable with two values selected, as Grafana sends it
    rules += [
        {"record": f"dashboard:pools{i}", "expr": dashboard_spec.interpolate(expr, {"pool": "(pool-a|pool-b)"})}
        for i, (_, expr) in enumerate(dashboard_spec.all_queries())
    ]
    f = tmp_path / "dashboard-rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run(
        [promtool, "check", "rules", str(f), str(PROMETHEUS_RULES)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_dashboard_query_names_an_exported_or_recorded_metric() -> None:
    from dra_driver.metrics import DriverMetrics

    used = dashboard_metric_names()
    known = exported_metric_names() | recorded_metric_names()
    if not hasattr(DriverMetrics([0]), "rl_steps_total"):
        known |= RL_PROGRESS  # the driver's rose_rl_* counters (workload reports) are merged separately
    missing = sorted(n for n in used - known if not SERVING_ENGINE.match(n))
    assert not missing, f"dashboard queries name metrics no component exports: {missing}"
    assert used >= RL_PROGRESS and {"vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_waiting"} <= used


def test_lent_gpus_panel_counts_lent_gpus_not_every_gpu() -> None:
    lent = next(p for p in dashboard_spec.PANELS if p.title.startswith("GPUs lent"))
    exprs = " ".join(t.expr for t in lent.targets)
    assert "rose_driver_lent_gpus" in exprs and "rose_driver_gpu_residency" not in exprs


def test_the_predictor_example_query_is_recorded() -> None:
    pools = yaml.safe_load(
        yaml.safe_load((ROOT / "manifests/predictor/configmap.yaml").read_text())["data"]["pools.yaml"]
    )
    for pool in pools["pools"]:
        names = set(re.findall(r"\brose_[a-z0-9_]+", pool["query"]))
        assert names <= recorded_metric_names() | exported_metric_names(), pool


def test_interpolate_refuses_an_unknown_variable() -> None:
    with pytest.raises(ValueError, match=r"\$nope, which is not a dashboard variable"):
        dashboard_spec.interpolate('sum(x{a=~"$nope"})')


def test_all_metrics_carry_the_rose_prefix() -> None:
    assert all(n.startswith("rose_") for n in exported_metric_names())
