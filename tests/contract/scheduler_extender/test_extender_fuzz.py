"""Robustness: >= 10,000 malformed or hostile bodies against one running extender over one HTTP
connection — wrong types, huge lists, unknown nodes, unknown victim UIDs, truncated JSON, random
bytes. Never a 5xx or a dropped connection; client errors are 4xx with a JSON message; well-formed
calls get answers that respect the contract; correct golden answers afterwards."""

from __future__ import annotations

import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_extender.server import Extender, ExtenderServer
from tests.support.extender_fixtures import Recorder, cluster_cache, pod

NODES = ["n1", "n2", "n3"]
UIDS = ["uid-rl", "uid-batch", "uid-serving"]
EXAMPLES = int(__import__("os").environ.get("ROSE_EXTENDER_FUZZ_EXAMPLES", "10000"))
BATCH = 5  # bodies per hypothesis example: amortises the engine's per-example cost
GOLDEN = Path(__file__).resolve().parents[2] / "support" / "extender_golden"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ExtenderServer, http.client.HTTPConnection]]:
    cache = cluster_cache(
        {"p": NODES},
        gpus=2,
        objects=[
            ("Pod", pod("rl", "uid-rl", node_name="n1", job="j")),
            ("Pod", pod("batch", "uid-batch", node_name="n2")),
            ("Pod", pod("srv", "uid-serving", node_name="n3", serving=True)),
        ],
    )
    srv = ExtenderServer(Extender(cache, suspender=Recorder()), "127.0.0.1", 0, max_body=4 * 1024 * 1024).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        yield srv, conn
    finally:
        conn.close()
        srv.stop()


KINDS = (
    "valid",
    "wrong_type",
    "unknown_nodes",
    "unknown_uids",
    "huge",
    "truncated",
    "bytes",
    "random_json",
    "hostile_pod",
)


def junk(rnd: random.Random, depth: int = 0) -> Any:
    """A random JSON value (the wrong type almost anywhere it lands)."""
    pick = rnd.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rnd.random() < 0.5
    if pick == 2:
        return rnd.randint(-(2**70), 2**70)
    if pick == 3:
        return rnd.uniform(-1e300, 1e300)
    if pick in (4, 5):
        return "".join(chr(rnd.randrange(0x20, 0x2FFF)) for _ in range(rnd.randrange(12)))
    if pick in (6, 7):
        return [junk(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    return {str(junk(rnd, 3)): junk(rnd, depth + 1) for _ in range(rnd.randrange(4))}


def valid_pod(rnd: random.Random) -> dict[str, Any]:
    kind = rnd.choice(["rl", "serving", "other"])
    return pod(
        f"p{rnd.randrange(100)}",
        rnd.choice([*UIDS, "new"]),
        job="j" if kind == "rl" else None,
        serving=kind == "serving",
        annotations=rnd.choice(
            [
                {},
                {"rose.io/gpus": str(rnd.randrange(-2, 5))},
                {"rose.io/state-bytes": "x"},
                {"rose.io/min-useful-run-seconds": "99999"},
            ]
        ),
    )


def valid_body(verb: str, rnd: random.Random, names: list[str], uids: list[str]) -> dict[str, Any]:
    if verb == "preempt":
        victims = {
            rnd.choice(names): {
                "Pods": [{"UID": rnd.choice(uids)} for _ in range(rnd.randrange(4))],
                "NumPDBViolations": rnd.randrange(3),
            }
            for _ in range(rnd.randrange(5))
        }
        return {"Pod": valid_pod(rnd), "NodeNameToVictims": None, "NodeNameToMetaVictims": victims}
    return {"Pod": valid_pod(rnd), "Nodes": None, "NodeNames": rnd.sample(names, rnd.randrange(len(names) + 1))}


def set_somewhere(rnd: random.Random, obj: Any, value: Any) -> None:
    """Replace one randomly chosen value inside ``obj`` (a dict or list tree) with ``value``."""
    for _ in range(rnd.randrange(1, 6)):
        if isinstance(obj, dict) and obj:
            key = rnd.choice(list(obj))
            if not isinstance(obj[key], dict | list) or rnd.random() < 0.3:
                obj[key] = value
                return
            obj = obj[key]
        elif isinstance(obj, list) and obj:
            i = rnd.randrange(len(obj))
            if not isinstance(obj[i], dict | list) or rnd.random() < 0.3:
                obj[i] = value
                return
            obj = obj[i]
        else:
            return


def make_body(verb: str, kind: str, rnd: random.Random) -> bytes:
    if kind == "bytes":
        return rnd.randbytes(rnd.randrange(64))
    if kind == "random_json":
        return json.dumps(junk(rnd)).encode()
    names, uids = [*NODES, "ghost"], [*UIDS, "nobody"]
    if kind == "unknown_nodes":
        names = [f"ghost-{rnd.randrange(10**6)}" for _ in range(8)]
    if kind == "unknown_uids":
        uids = [f"uid-{rnd.randrange(10**9)}" for _ in range(8)]
    body = valid_body(verb, rnd, names, uids)
    if kind == "huge":
        if verb == "preempt":
            body["NodeNameToMetaVictims"] = {"n1": {"Pods": [{"UID": f"u{i}"} for i in range(12_000)]}}
        else:
            body["NodeNames"] = [f"huge-{i}" for i in range(rnd.choice([5_000, 120_000]))]
    elif kind == "wrong_type":
        set_somewhere(rnd, body, junk(rnd))
    elif kind == "hostile_pod":
        body["Pod"] = junk(rnd) if rnd.random() < 0.3 else {"metadata": junk(rnd), "spec": junk(rnd)}
    raw = json.dumps(body).encode()
    if kind == "truncated" and raw:
        raw = raw[: rnd.randrange(len(raw))]
    return raw


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """Hypothesis chooses the verb, the kind of hostility and the seed; the body is built from them."""
    verb = draw(st.sampled_from(["filter", "prioritize", "preempt"]))
    kind = draw(st.sampled_from(KINDS))
    # a few huge bodies are enough: keep them rare (1 in 20 of the "huge" draws) for speed
    if kind == "huge" and draw(st.integers(0, 19)) != 0:
        kind = "unknown_nodes"
    rnd = random.Random(draw(st.integers(0, 2**32)))
    return verb, make_body(verb, kind, rnd)


def check_reply(verb: str, raw: bytes, status: int, reply: Any) -> None:
    assert status in (200, 400), (status, reply)
    if status == 400:
        assert isinstance(reply, dict) and reply.get("Error"), reply
        return
    req = json.loads(raw)
    if verb == "filter":
        sent = set(req.get("NodeNames") or [])
        assert set(reply["NodeNames"]) <= sent or req.get("NodeNames") is None
        assert reply["Error"] == ""
    elif verb == "prioritize":
        assert isinstance(reply, list)
        for hp in reply:
            assert set(hp) == {"Host", "Score"} and 0 <= hp["Score"] <= 10
    else:
        given_victims = req.get("NodeNameToMetaVictims") or {}
        for node, mv in reply["NodeNameToMetaVictims"].items():
            assert mv["Pods"], "every returned node needs at least one victim"
            offered = {p["UID"] for p in given_victims[node]["Pods"]}
            got = {p["UID"] for p in mv["Pods"]}
            assert got <= offered and "uid-rl" not in got


def test_hostile_bodies_never_crash_the_server(
    served: tuple[ExtenderServer, http.client.HTTPConnection],
) -> None:
    srv, conn = served
    sent = 0

    @settings(
        max_examples=EXAMPLES // BATCH,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(bodies(), min_size=BATCH, max_size=BATCH))
    def one(cases: list[tuple[str, bytes]]) -> None:
        nonlocal sent
        for verb, raw in cases:
            conn.request("POST", f"/{verb}", body=raw, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            sent += 1
            assert resp.status < 500, data[:300]
            check_reply(verb, raw, resp.status, json.loads(data))

    one()
    assert sent >= EXAMPLES
    assert srv.extender.metrics.requests.labels("filter", "500")._value.get() == 0
    # correct answers afterwards, on the same connection
    body = json.dumps({"Pod": pod("s", "u", serving=True), "Nodes": None, "NodeNames": NODES}).encode()
    conn.request("POST", "/prioritize", body=body)
    resp = conn.getresponse()
    assert resp.status == 200
    assert json.loads(resp.read()) == [{"Host": n, "Score": 10} for n in NODES]
    body = json.dumps(
        {
            "Pod": pod("s", "u", serving=True),
            "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-rl"}]}, "n2": {"Pods": [{"UID": "uid-batch"}]}},
        }
    ).encode()
    conn.request("POST", "/preempt", body=body)
    resp = conn.getresponse()
    assert json.loads(resp.read()) == {
        "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "uid-batch"}], "NumPDBViolations": 0}}
    }
