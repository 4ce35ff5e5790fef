"""The suspended RL worker's CPU: pure resize plans (dra_driver.resize) and the resizer's I/O
order against a small in-memory stand-in of the pod endpoints (no network)."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.claims import PodRef
from dra_driver.kube import PodResizer
from dra_driver.metrics import DriverMetrics
from dra_driver.resize import (
    QuantityError,
    ResizeError,
    cpu_millis,
    decide,
    encode_saved,
    is_guaranteed,
    parse_quantity,
    plan_restore,
    plan_shrink,
    read_saved,
    resize_unsupported,
)
from rose_common import names
from rose_common.kube.errors import ApiError, Conflict, Status, Unprocessable


def container(
    name: str = "main",
    cpu: str | None = "60",
    limit: str | None = None,
    mem: str | None = None,
    mem_limit: str | None = None,
    policy: str | None = None,
) -> dict[str, Any]:
    req: dict[str, str] = {}
    lim: dict[str, str] = {}
    if cpu is not None:
        req["cpu"] = cpu
    if limit is not None:
        lim["cpu"] = limit
    if mem is not None:
        req["memory"] = mem
    if mem_limit is not None:
        lim["memory"] = mem_limit
    c: dict[str, Any] = {"name": name, "image": "x", "resources": {}}
    if req:
        c["resources"]["requests"] = req
    if lim:
        c["resources"]["limits"] = lim
    if policy is not None:
        c["resizePolicy"] = [
            {"resourceName": "memory", "restartPolicy": "NotRequired"},
            {"resourceName": "cpu", "restartPolicy": policy},
        ]
    return c


def pod(
    *containers: dict[str, Any],
    ann: dict[str, str] | None = None,
    qos: str | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "metadata": {"namespace": "ml", "name": "rl-0", "uid": "u-1", "resourceVersion": "7", "annotations": ann or {}},
        "spec": {"containers": list(containers)},
        "status": {},
    }
    if qos:
        p["status"]["qosClass"] = qos
    if init:
        p["spec"]["initContainers"] = init
    return p


def apply(p: dict[str, Any], patch: dict[str, Any] | None, saved: str | None = None) -> dict[str, Any]:
    """What the API server does with our resize patch (strategic merge on containers by name)."""
    out = copy.deepcopy(p)
    if saved is not None:
        out["metadata"]["annotations"][names.ANNOTATION_SUSPENDED_CPU] = saved
    for entry in (patch or {}).get("spec", {}).get("containers", []):
        c = next(c for c in out["spec"]["containers"] if c["name"] == entry["name"])
        for kind, vals in entry["resources"].items():
            c.setdefault("resources", {}).setdefault(kind, {}).update(vals)
    return out


# ---------------------------------------------------------------- quantities
@pytest.mark.parametrize(
    ("q", "millis"),
    [
        ("60", 60_000),
        ("1.5", 1500),
        ("1500m", 1500),
        ("100m", 100),
        ("2k", 2_000_000),
        ("0.1", 100),
        (".5", 500),
        ("1e3", 1_000_000),
        ("250000u", 250),
        ("1n", 1),  # rounded up like MilliValue
        ("1Ki", 1_024_000),
        ("0", 0),
    ],
)
def test_cpu_quantities(q: str, millis: int) -> None:
    assert cpu_millis(q) == millis


@pytest.mark.parametrize("q", ["", "abc", "1.2.3", "5 ", " 5", "1x", "1KI", "m", "--1", "1e", "-1"])
def test_malformed_cpu_quantities_are_refused(q: str) -> None:
    with pytest.raises(QuantityError):
        cpu_millis(q)


@given(st.integers(min_value=0, max_value=10**9))
def test_millis_round_trip(m: int) -> None:
    assert cpu_millis(f"{m}m") == m
    assert parse_quantity(f"{m}m") == Decimal(m) / 1000


# ---------------------------------------------------------------- shrink
def test_burstable_lowers_only_the_request() -> None:
    p = pod(container(cpu="60", limit="64", mem="1Gi"), qos="Burstable")
    plan = plan_shrink(p)
    assert plan.patch == {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "100m"}}}]}}
    assert plan.saved is not None and plan.saved.containers == {"main": {"request": "60"}}
    assert plan.skipped == ()


def test_guaranteed_lowers_request_and_limit() -> None:
    c = container(cpu="4", limit="4", mem="8Gi", mem_limit="8Gi")
    p = pod(c, container("side", cpu="50m", limit="50m", mem="64Mi", mem_limit="64Mi"), qos="Guaranteed")
    plan = plan_shrink(p, "200m")
    res = {"requests": {"cpu": "200m"}, "limits": {"cpu": "200m"}}
    assert plan.patch == {"spec": {"containers": [{"name": "main", "resources": res}]}}  # "side" is already small
    assert plan.saved is not None and plan.saved.containers == {"main": {"request": "4", "limit": "4"}}
    assert plan.saved.target == "200m"


def test_qos_computed_when_the_status_has_none() -> None:
    g = container(cpu="2", limit="2", mem="1Gi", mem_limit="1Gi")
    assert is_guaranteed(pod(g))
    assert not is_guaranteed(pod(g, container("b", cpu="1")))
    assert not is_guaranteed(pod(g, init=[container("init", cpu="1", limit="2", mem="1Gi", mem_limit="1Gi")]))
    assert not is_guaranteed(pod())


def test_restart_container_policy_is_skipped_with_its_reason() -> None:
    p = pod(container(cpu="8", policy="RestartContainer"), container("helper", cpu="2", policy="NotRequired"))
    plan = plan_shrink(p)
    assert plan.patch == {"spec": {"containers": [{"name": "helper", "resources": {"requests": {"cpu": "100m"}}}]}}
    assert [c for c, _ in plan.skipped] == ["main"] and "RestartContainer" in plan.skipped[0][1]
    assert plan.saved is not None and plan.saved.containers == {"helper": {"request": "2"}}
    assert "main" in plan.saved.skipped


def test_already_small_and_no_requests_need_nothing() -> None:
    for p in (pod(container(cpu="100m")), pod(container(cpu="50m")), pod(container(cpu=None)), pod()):
        plan = plan_shrink(p)
        assert plan.patch is None and plan.saved is not None and plan.saved.containers == {}


def test_init_containers_are_left_alone() -> None:
    p = pod(container(cpu="1"), init=[container("init", cpu="16")])
    plan = plan_shrink(p)
    assert plan.patch is not None and [c["name"] for c in plan.patch["spec"]["containers"]] == ["main"]


def test_pod_level_cpu_is_skipped() -> None:
    p = pod(container(cpu=None))
    p["spec"]["resources"] = {"requests": {"cpu": "8"}}
    plan = plan_shrink(p)
    assert plan.patch is None and plan.skipped and "pod-level" in plan.skipped[0][1]


def test_malformed_quantity_names_pod_container_and_value() -> None:
    with pytest.raises(ResizeError, match=r"pod ml/rl-0 container 'main': cpu request '6O' is malformed"):
        plan_shrink(pod(container(cpu="6O")))
    with pytest.raises(ResizeError, match="target"):
        plan_shrink(pod(container()), "lots")


def test_repeated_shrink_keeps_the_originals_and_does_not_shrink_twice() -> None:
    p = pod(container(cpu="60"), qos="Burstable")
    first = plan_shrink(p)
    assert first.saved is not None
    shrunk = apply(p, first.patch, encode_saved(first.saved))
    again = plan_shrink(shrunk)
    assert again.patch is None and again.saved is None  # nothing to do, originals untouched
    # the annotation was saved but the resize never happened (crash, API error): only the resize again
    half = apply(p, None, encode_saved(first.saved))
    retry = plan_shrink(half)
    assert retry.saved is None and retry.patch == first.patch
    assert read_saved(half) == first.saved


# ---------------------------------------------------------------- restore and round trip
@pytest.mark.parametrize(
    "p",
    [
        pod(container(cpu="60", limit="64", mem="1Gi"), qos="Burstable"),
        pod(container(cpu="1500m", limit="1500m", mem="2Gi", mem_limit="2Gi"), qos="Guaranteed"),
        pod(container(cpu="8", policy="RestartContainer"), container("b", cpu="2k"), qos="Burstable"),
        pod(container(cpu="100m")),
        pod(container(cpu=None), container("b", cpu="1.5")),
    ],
)
def test_round_trip_gives_exactly_the_original_resources(p: dict[str, Any]) -> None:
    plan = plan_shrink(p)
    assert plan.saved is not None
    shrunk = apply(p, plan.patch, encode_saved(plan.saved))
    for c in shrunk["spec"]["containers"]:
        if c["name"] in plan.saved.containers:
            assert c["resources"]["requests"]["cpu"] == "100m"
    restore = plan_restore(shrunk)
    assert restore.remove_annotation
    back = apply(shrunk, restore.patch)
    assert back["spec"] == p["spec"]
    assert plan_restore(back).patch is None  # a repeated restore changes nothing


def test_restore_without_annotation_is_nothing() -> None:
    plan = plan_restore(pod(container()))
    assert plan.patch is None and not plan.remove_annotation


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        '{"target": "100m"}',
        '{"target": 100, "containers": {}}',
        '{"target": "100m", "containers": {"main": "60"}}',
        '{"target": "100m", "containers": {"main": {"request": "sixty"}}}',
        '{"target": "100m", "containers": {"main": {"request": "60", "extra": "1"}}}',
        '{"target": "100m", "containers": {"ghost": {"request": "60"}}}',
    ],
)
def test_malformed_saved_annotation_is_a_clear_error(raw: str) -> None:
    p = pod(container(), ann={names.ANNOTATION_SUSPENDED_CPU: raw})
    with pytest.raises(ResizeError, match=r"ml/rl-0"):
        plan_restore(p)


# ---------------------------------------------------------------- decide (the pod watch's repair)
def test_decide_from_the_pods_own_annotations() -> None:
    saved = '{"target":"100m","containers":{}}'
    st_ = names.ANNOTATION_SUSPEND_STATE
    assert decide(pod(ann={st_: "Suspended"})) == "shrink"
    assert decide(pod(ann={st_: "Suspended", names.ANNOTATION_SUSPENDED_CPU: saved})) is None
    assert decide(pod(ann={st_: "Running", names.ANNOTATION_SUSPENDED_CPU: saved})) == "restore"
    assert decide(pod(ann={names.ANNOTATION_SUSPENDED_CPU: saved})) == "restore"
    for state in ("Suspending", "Resuming", "CheckpointedEvicted"):
        assert decide(pod(ann={st_: state, names.ANNOTATION_SUSPENDED_CPU: saved})) is None
    assert decide(pod(ann={st_: "Running"})) is None
    gone = pod(ann={st_: "Suspended"})
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert decide(gone) is None


# ---------------------------------------------------------------- the resizer's I/O, against a stand-in
class FakePods:
    """The two pod endpoints the resizer uses, applying patches like the API server."""

    def __init__(self, p: dict[str, Any]) -> None:
        self.pod = copy.deepcopy(p)
        self.calls: list[tuple[str, str, str]] = []
        self.fail_resize: ApiError | None = None

    def json(self, method: str, path: str, query: Any = None, body: Any = None, content_type: str = "") -> Any:
        self.calls.append((method, path.rsplit("/", 1)[-1], content_type))
        if method == "GET":
            return copy.deepcopy(self.pod)
        assert method == "PATCH"
        meta = self.pod["metadata"]
        if path.endswith("/resize"):
            assert content_type == "application/strategic-merge-patch+json"
            if self.fail_resize is not None:
                raise self.fail_resize
            if resize_unsupported(self.pod) is not None:  # the API server's own rule
                raise Unprocessable(
                    Status(422, "Invalid", "spec: Forbidden: Pod running on node without support for resize")
                )
            self.pod = apply(self.pod, body)
        else:
            assert content_type == "application/merge-patch+json" and body["metadata"]["uid"] == meta["uid"]
            rv = body["metadata"].get("resourceVersion")
            if rv is not None and rv != meta["resourceVersion"]:
                raise Conflict(Status(409, "Conflict", "the object has been modified"))
            for k, v in body["metadata"]["annotations"].items():
                if v is None:
                    meta["annotations"].pop(k, None)
                else:
                    meta["annotations"][k] = v
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.pod)


def resizer(p: dict[str, Any]) -> tuple[PodResizer, FakePods, list[tuple[str, str]], DriverMetrics]:
    fake = FakePods(p)
    events: list[tuple[str, str]] = []
    m = DriverMetrics([0])
    r = PodResizer(fake, "100m", lambda ref, reason, msg, warn: events.append((reason, msg)), m)  # type: ignore[arg-type]
    return r, fake, events, m


REF = PodRef(namespace="ml", name="rl-0", uid="u-1")


def count(m: DriverMetrics, action: str, result: str) -> float:
    return float(m.registry.get_sample_value("rose_driver_pod_resize_total", {"action": action, "result": result}) or 0)


def test_resizer_saves_first_then_resizes_and_restores() -> None:
    original = pod(container(cpu="60", limit="64"), qos="Burstable", ann={names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    r, fake, events, m = resizer(original)
    assert r.sync(REF) == "shrink/ok"
    assert [c[:2] for c in fake.calls] == [("GET", "rl-0"), ("PATCH", "rl-0"), ("PATCH", "resize")]
    assert fake.pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "100m"}, "limits": {"cpu": "64"}}
    assert json.loads(fake.pod["metadata"]["annotations"][names.ANNOTATION_SUSPENDED_CPU])["containers"] == {
        "main": {"request": "60"}
    }
    assert [e[0] for e in events] == [names.EVENT_CPU_RELEASED]
    fake.calls.clear()
    assert r.sync(REF) == ""  # a repeated Suspended: nothing written
    assert [c[0] for c in fake.calls] == ["GET"]
    fake.pod["metadata"]["annotations"][names.ANNOTATION_SUSPEND_STATE] = "Running"
    assert r.sync(REF) == "restore/ok"
    assert fake.pod["spec"] == original["spec"]
    assert names.ANNOTATION_SUSPENDED_CPU not in fake.pod["metadata"]["annotations"]
    assert [e[0] for e in events] == [names.EVENT_CPU_RELEASED, names.EVENT_CPU_RESTORED]
    assert count(m, "shrink", "ok") == 1 and count(m, "restore", "ok") == 1 and count(m, "shrink", "error") == 0


def test_resizer_failure_is_counted_and_reported_never_raised() -> None:
    r, fake, events, m = resizer(pod(container(cpu="4"), ann={names.ANNOTATION_SUSPEND_STATE: "Suspended"}))
    fake.fail_resize = ApiError(Status(403, "Forbidden", "pods/resize is forbidden"))
    assert r.sync(REF) == "shrink/error"
    assert events[-1][0] == names.EVENT_CPU_RESIZE_FAILED and "403" in events[-1][1]
    assert count(m, "shrink", "error") == 1
    # the originals were saved before the failed resize; the next Suspended retries only the resize
    fake.fail_resize = None
    assert r.sync(REF) == "shrink/ok"
    assert fake.pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    assert json.loads(fake.pod["metadata"]["annotations"][names.ANNOTATION_SUSPENDED_CPU])["containers"] == {
        "main": {"request": "4"}
    }
    # a malformed annotation on restore: a clear error Event, no exception
    fake.pod["metadata"]["annotations"].update(
        {names.ANNOTATION_SUSPEND_STATE: "Running", names.ANNOTATION_SUSPENDED_CPU: "{oops"}
    )
    assert r.sync(REF) == "restore/error"
    assert "ml/rl-0" in events[-1][1] and "not JSON" in events[-1][1]


def test_node_without_in_place_resize_is_a_skip_not_an_error() -> None:
    p = pod(container(cpu="4"), ann={names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    # a running container whose status reports no resources: its kubelet has no in-place resize
    p["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    r, fake, events, m = resizer(p)
    assert r.sync(REF) == "shrink/skipped"
    assert events[-1][0] == names.EVENT_CPU_RESIZE_SKIPPED and "reports no container resources" in events[-1][1]
    assert not any(c[1] == "resize" for c in fake.calls)  # decided from the pod, not from a refusal
    assert count(m, "shrink", "skipped") == 1 and count(m, "shrink", "error") == 0
    fake.pod["metadata"]["annotations"][names.ANNOTATION_SUSPEND_STATE] = "Running"
    assert r.sync(REF) == "restore/skipped"  # nothing was shrunk: the annotation just goes
    assert fake.pod["spec"] == p["spec"] and names.ANNOTATION_SUSPENDED_CPU not in fake.pod["metadata"]["annotations"]


def test_resizer_skip_is_reported_once() -> None:
    p = pod(container(cpu="8", policy="RestartContainer"), ann={names.ANNOTATION_SUSPEND_STATE: "Suspended"})
    r, fake, events, m = resizer(p)
    assert r.sync(REF) == "shrink/skipped"
    assert events == [(names.EVENT_CPU_RESIZE_SKIPPED, events[0][1])] and "RestartContainer" in events[0][1]
    assert fake.pod["spec"] == p["spec"] and not any(c[1] == "resize" for c in fake.calls)
    assert r.sync(REF) == "" and len(events) == 1 and count(m, "shrink", "skipped") == 1
    fake.pod["metadata"]["annotations"][names.ANNOTATION_SUSPEND_STATE] = "Running"
    assert r.sync(REF) == "restore/skipped"
    assert names.ANNOTATION_SUSPENDED_CPU not in fake.pod["metadata"]["annotations"]


def test_resizer_queue_runs_in_the_background() -> None:
    r, fake, _, _ = resizer(pod(container(cpu="2"), ann={names.ANNOTATION_SUSPEND_STATE: "Suspended"}))
    r.observe(fake.pod)
    assert r.wait_idle(5)
    assert fake.pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    r.observe(fake.pod)  # consistent now: not queued again
    assert r.wait_idle(5) and sum(1 for c in fake.calls if c[0] == "GET") == 1
    r.stop()


def test_metric_series_start_at_zero() -> None:
    m = DriverMetrics([0])
    for action in ("shrink", "restore"):
        for result in ("ok", "skipped", "error"):
            assert (
                m.registry.get_sample_value("rose_driver_pod_resize_total", {"action": action, "result": result}) == 0.0
            )
