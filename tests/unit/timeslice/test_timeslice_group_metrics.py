"""Issue 13 §6 leftovers: host DRAM held per group and job (the state a hand-over suspended),
bytes moved by the Kubernetes hand-over, and the time-slice row of the dashboard."""

from __future__ import annotations

import yaml
from prometheus_client import generate_latest

from rose_cli import dashboard_spec
from rose_common import names, promtext
from tests.support.handover_fakes import GROUP, HandoverCluster, group_pods
from tests.support.manifest_files import PROMETHEUS_RULES
from timeslice.handover import KubeHandover, state_bytes
from timeslice.metrics import TimesliceMetrics
from timeslice.orchestrator import NoopOutcome, Orchestrator
from timeslice.store import MemoryStore

GIB = 1 << 30


def _sized(reported: int | None, estimate: int | None) -> HandoverCluster:
    pods = group_pods()
    for p in pods:
        ann = p["metadata"]["annotations"]
        if reported is not None and p["metadata"]["labels"][names.LABEL_JOB] == "a":
            ann[names.ANNOTATION_REPORTED_STATE_BYTES] = str(reported)
        if estimate is not None:
            ann[names.ANNOTATION_STATE_BYTES] = str(estimate)
    return HandoverCluster({f"ml/{w['metadata']['name']}": w for w in pods})


def test_the_kube_handover_reports_the_state_it_suspended_and_moved() -> None:
    c = _sized(reported=3 * GIB, estimate=GIB)  # a's workers report 3 GiB each; b has only the estimate
    res = KubeHandover(c, clock=c.clock).switch(GROUP, 3, "ml/a", "ml/b", deadline=c.now + 30)
    assert res.ok, res.error
    assert (res.suspended_bytes, res.bytes_moved) == (6 * GIB, 6 * GIB + 2 * GIB)
    first = _sized(None, None)  # nothing resident before, and no size known: nothing counted
    res = KubeHandover(first, clock=first.clock).switch(GROUP, 1, None, "ml/b", deadline=first.now + 30)
    assert res.ok and (res.suspended_bytes, res.bytes_moved) == (0, 0)
    assert state_bytes([{"metadata": {"annotations": {names.ANNOTATION_STATE_BYTES: "x1"}}}]) == 0


class SizedHandover:
    """Explicit stand-in for the nodes: every job's state is ``size[job]`` bytes."""

    def __init__(self, size: dict[str, int]) -> None:
        self.size = size

    def switch(self, group: str, token: int, out_job: str | None, in_job: str, deadline: float) -> NoopOutcome:
        out = self.size.get(out_job or "", 0)
        return NoopOutcome(suspend_s=0.01, restore_s=0.02, bytes_moved=out + self.size[in_job], suspended_bytes=out)


def _held(m: TimesliceMetrics, job: str) -> float:
    text = generate_latest(m.registry).decode()
    return promtext.value(text, "rose_timeslice_host_state_bytes", {"group": "g", "job": job})


def test_host_dram_held_follows_each_hand_over_per_group_and_job() -> None:
    m = TimesliceMetrics()
    o = Orchestrator(MemoryStore(), SizedHandover({"a": 5 * GIB, "b": 7 * GIB}), m)
    a = o.acquire("g", "a")
    assert _held(m, "a") == 0  # restored: on the devices
    o.yield_("g", "a", a.token)
    o.yield_("g", "b", o.acquire("g", "b").token)
    assert (_held(m, "a"), _held(m, "b")) == (5 * GIB, 0)
    o.acquire("g", "a")
    assert (_held(m, "a"), _held(m, "b")) == (0, 7 * GIB)
    text = generate_latest(m.registry).decode()
    assert promtext.value(text, "rose_timeslice_bytes_moved_total", {"group": "g"}) == (5 + 12 + 12) * GIB


def test_the_dashboard_has_a_time_slice_row_over_every_issue_13_metric() -> None:
    row = next(r for r in dashboard_spec.ROWS if r.title.startswith("Time-slicing"))
    exprs = " ".join(t.expr for p in row.panels for t in p.targets)
    for metric in (
        "rose_timeslice_duty_cycle",
        "rose_timeslice_wait_seconds_bucket",
        "rose_timeslice_switch_seconds",
        "rose_timeslice_host_state_bytes",
        "rose_timeslice_bytes_moved_total",
        "rose_timeslice_grants_total",
        "rose_timeslice_fencing_rejections_total",
        "rose_timeslice_lease_expiries_total",
        "rose_rl_steps_per_hour",
        "rose_rl_samples_per_hour",
    ):
        assert metric in exprs, metric
    rules = {
        r["record"]: r["expr"]
        for g in yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    assert rules["rose_rl_steps_per_hour"].startswith("3600 * sum by (namespace, job) (rate(rose_rl_steps_total")
    assert "rose_rl_samples_total" in rules["rose_rl_samples_per_hour"]
