"""Golden wire JSON: exact Go field names, bare-array prioritize reply, preempt reply shape.

The request files in ``extender_golden/`` have the shape kube-scheduler's Go ``json.Marshal``
produces with ``nodeCacheCapable: true`` (files named ``captured-*`` were written by the real
kube-scheduler v1.37 through ``--capture-dir``). Replies are compared byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler_extender import wire
from scheduler_extender.forecast import reduce
from scheduler_extender.model import PodInfo, PodKind, PoolForecast
from scheduler_extender.server import Extender
from tests.support.extender_fixtures import T0, claim, cluster_cache, forecast, pod

GOLDEN = Path(__file__).resolve().parents[2] / "support" / "extender_golden"


class Forecasts:
    def __init__(self, by_pool: dict[str, PoolForecast]) -> None:
        self.by_pool = by_pool

    def get(self, pool: str) -> PoolForecast | None:
        return self.by_pool.get(pool)


class Recorder:
    """Test double for the API-server suspender: records what would be requested."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def request(self, pod: object, reason: str, preemptor: object) -> None:
        self.calls.append((getattr(pod, "uid", ""), reason))


class PendingPods:
    """Test double for the API server's view of the preemptor (the golden file's llm-0, pending)."""

    def get(self, namespace: str, name: str) -> PodInfo | None:
        if (namespace, name) != ("rl", "llm-0"):
            return None
        return PodInfo(namespace, name, "9d1c", PodKind.SERVING, priority=1000)


def golden_extender() -> tuple[Extender, Recorder]:
    cache = cluster_cache(
        {"long": ["node-a", "node-b"], "short": ["node-c", "node-d"]},
        gpus=4,
        objects=[
            ("ResourceClaim", claim("rl", "d-all", "node-d", [f"gpu-{i}-lendable" for i in range(4)])),
            ("Pod", pod("batch", "uid-batch", ns="rl", node_name="node-a")),
            ("Pod", pod("rl-a", "uid-rl-a", ns="rl", node_name="node-a", job="other")),
            ("Pod", pod("rl-b", "uid-rl-b", ns="rl", node_name="node-b", job="other")),
        ],
    )
    fcs = {
        "long": reduce(forecast("long", {600: 1, 1800: 1, 3600: 2}), "0.9"),
        "short": reduce(forecast("short", {600: 2, 1800: 8, 3600: 8}), "0.9"),
    }
    rec = Recorder()
    return Extender(cache, forecasts=Forecasts(fcs), suspender=rec, preemptors=PendingPods(), clock=T0.timestamp), rec


def expected(name: str) -> bytes:
    return (GOLDEN / name).read_bytes().strip()


@pytest.mark.parametrize(
    ("verb", "request_file", "reply_file"),
    [
        ("filter", "filter-rl-request.json", "filter-rl-reply.json"),
        ("prioritize", "prioritize-rl-request.json", "prioritize-rl-reply.json"),
        ("preempt", "preempt-serving-request.json", "preempt-serving-reply.json"),
    ],
)
def test_golden_reply_bytes(verb: str, request_file: str, reply_file: str) -> None:
    ext, _ = golden_extender()
    code, body = ext.handle(verb, (GOLDEN / request_file).read_bytes())
    assert code == 200, body
    assert body == expected(reply_file)


def test_filter_reply_semantics_and_casing() -> None:
    ext, _ = golden_extender()
    _, body = ext.handle("filter", (GOLDEN / "filter-rl-request.json").read_bytes())
    reply = json.loads(body)
    assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    # min useful run 1200 s: pool "short" is needed by serving at 1800 s → only 600 s idle
    assert reply["NodeNames"] == ["node-a", "node-b"]
    assert set(reply["FailedAndUnresolvableNodes"]) == {"node-c", "node-d"}
    assert reply["Error"] == "" and reply["FailedNodes"] == {}
    request = json.loads((GOLDEN / "filter-rl-request.json").read_bytes())
    assert set(reply["NodeNames"]) <= set(request["NodeNames"])
    wire.ExtenderFilterResult.model_validate(reply)


def test_prioritize_reply_is_a_bare_array_in_range() -> None:
    ext, _ = golden_extender()
    _, body = ext.handle("prioritize", (GOLDEN / "prioritize-rl-request.json").read_bytes())
    reply = json.loads(body)
    assert isinstance(reply, list)
    parsed = wire.HostPriorityList.model_validate(reply)
    assert [h.Host for h in parsed.root] == ["node-a", "node-b"]
    assert all(0 <= h.Score <= 10 for h in parsed.root)


def test_preempt_suspends_rl_victim_and_drops_its_node() -> None:
    ext, rec = golden_extender()
    _, body = ext.handle("preempt", (GOLDEN / "preempt-serving-request.json").read_bytes())
    # node-b's only victim is an RL worker: zero evictions needed there → suspend it, drop node-b;
    # node-a (a batch pod + an RL worker) is not used, nothing there is touched.
    assert json.loads(body) == {"NodeNameToMetaVictims": {}}
    assert [uid for uid, _ in rec.calls] == ["uid-rl-b"]
    # idempotent: a retry does not ask twice
    ext.handle("preempt", (GOLDEN / "preempt-serving-request.json").read_bytes())
    assert len(rec.calls) == 1


def test_nodes_list_is_echoed_without_node_cache() -> None:
    ext, _ = golden_extender()
    req = json.loads((GOLDEN / "filter-rl-request.json").read_bytes())
    names = req.pop("NodeNames")
    req["NodeNames"] = None
    req["Nodes"] = {"metadata": {}, "items": [{"metadata": {"name": n, "labels": {"x": n}}} for n in names]}
    code, body = ext.handle("filter", json.dumps(req).encode())
    assert code == 200
    reply = json.loads(body)
    assert [i["metadata"] for i in reply["Nodes"]["items"]] == [
        {"name": "node-a", "labels": {"x": "node-a"}},
        {"name": "node-b", "labels": {"x": "node-b"}},
    ]


def test_go_casing_is_exact_in_models() -> None:
    fields = set(wire.ExtenderFilterResult.model_fields)
    assert fields == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert set(wire.ExtenderPreemptionArgs.model_fields) == {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}
    assert set(wire.MetaVictims.__annotations__) == {"Pods", "NumPDBViolations"}
    assert set(wire.MetaPod.__annotations__) == {"UID"}
    assert set(wire.HostPriority.model_fields) == {"Host", "Score"}


CAPTURED = sorted(GOLDEN.glob("captured-*-request.json"))


def test_captured_bodies_from_the_real_kube_scheduler_exist() -> None:
    verbs = {p.name.split("-")[1] for p in CAPTURED}
    assert verbs >= {"filter", "prioritize", "preempt"}, (
        "capture them with ROSE_EXTENDER_CAPTURE_DIR=... pytest tests/e2e/scheduler_extender/test_extender_e2e.py"
    )


@pytest.mark.parametrize("path", CAPTURED, ids=[p.name for p in CAPTURED])
def test_captured_request_parses_and_matches_hand_written_shape(path: Path) -> None:
    """What kube-scheduler v1.37 really sent (nodeCacheCapable: names and UIDs only): our models
    read it, and the hand-written golden requests use the same top-level keys."""
    verb = path.name.split("-")[1]
    raw = json.loads(path.read_bytes())
    if verb == "preempt":
        args = wire.ExtenderPreemptionArgs.model_validate(raw)
        assert args.NodeNameToVictims is None and args.NodeNameToMetaVictims
        for mv in args.NodeNameToMetaVictims.values():
            assert mv.get("Pods") and all(p["UID"] for p in mv.get("Pods") or [])
        hand = json.loads((GOLDEN / "preempt-serving-request.json").read_bytes())
    else:
        fargs = wire.ExtenderArgs.model_validate(raw)
        assert fargs.Nodes is None and fargs.NodeNames
        assert fargs.Pod.metadata.uid and fargs.Pod.spec.scheduler_name == "rose-scheduler"
        hand = json.loads((GOLDEN / f"{verb}-rl-request.json").read_bytes())
    assert set(raw) == set(hand)
    assert {"metadata", "spec", "status"} <= set(raw["Pod"])


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("captured-*-reply-200.json")), ids=lambda p: p.name)
def test_captured_reply_accepted_by_kube_scheduler_has_our_exact_shape(path: Path) -> None:
    """Replies the real kube-scheduler accepted in the e2e run: the shape our code still emits."""
    verb = path.name.split("-")[1]
    raw = json.loads(path.read_bytes())
    if verb == "filter":
        assert set(raw) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        wire.ExtenderFilterResult.model_validate(raw)
    elif verb == "prioritize":
        assert isinstance(raw, list)
        wire.HostPriorityList.model_validate(raw)
    else:
        assert set(raw) == {"NodeNameToMetaVictims"}
        wire.ExtenderPreemptionResult.model_validate(raw)


def test_captured_filter_is_answered_byte_for_byte_like_in_the_e2e_run() -> None:
    """Replays the real kube-scheduler's filter call for the ``picky`` worker (min useful run
    1200 s) against the e2e cluster's state (pool-a quiet, pool-b needed by serving at 30 min)."""
    cache = cluster_cache({"pool-a": ["rose-node-0", "rose-node-2"], "pool-b": ["rose-node-1", "rose-node-3"]}, gpus=2)
    fcs = {
        "pool-a": reduce(forecast("pool-a", {600: 0, 1800: 0, 3600: 0}), "0.9"),
        "pool-b": reduce(forecast("pool-b", {600: 0, 1800: 4, 3600: 4}), "0.9"),
    }
    ext = Extender(cache, forecasts=Forecasts(fcs), suspender=Recorder(), clock=T0.timestamp)
    code, body = ext.handle("filter", (GOLDEN / "captured-filter-004-request.json").read_bytes())
    assert code == 200
    assert body == (GOLDEN / "captured-filter-004-reply-200.json").read_bytes().strip()
