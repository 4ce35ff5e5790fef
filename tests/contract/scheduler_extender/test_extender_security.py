"""Attacks on the extender, reproduced against its real HTTP server on 127.0.0.1 (issue 11:
High 1, Medium 3 and 4). Each test states the attack; each failed on the code before the fix.

The preemptor lookup is the one test double (the contract tier runs no API server; the e2e tier
uses the real one): :class:`PendingPods` answers as the API server would for pending pods.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks import extender_load
from scheduler_extender import cli, wire
from scheduler_extender.model import PodInfo, PodKind
from scheduler_extender.server import Extender, ExtenderServer, ServerLimits
from tests.support.extender_fixtures import Recorder, cluster_cache, pod, preempt_body

SERVING_PRIORITY = 1000


class PendingPods:
    """The API server's view of preemptors: ``llm-0`` (uid ``u-llm``) is pending at priority
    1000, ``low-0`` (uid ``u-low``) at 0; any other pod does not exist."""

    pods = {"llm-0": ("u-llm", SERVING_PRIORITY), "low-0": ("u-low", 0)}

    def get(self, namespace: str, name: str) -> PodInfo | None:
        if name not in self.pods:
            return None
        uid, prio = self.pods[name]
        return PodInfo(namespace, name, uid, PodKind.SERVING, priority=prio)


def _cache() -> Any:
    return cluster_cache(
        {"p": ["n1", "n2"]},
        gpus=2,
        objects=[
            ("Pod", pod("rl", "uid-rl", node_name="n1", job="j")),
            ("Pod", pod("llm-running", "uid-serving", node_name="n2", serving=True)),
        ],
    )


@pytest.fixture
def served() -> Iterator[tuple[ExtenderServer, Recorder]]:
    rec = Recorder()
    srv = ExtenderServer(Extender(_cache(), suspender=rec, preemptors=PendingPods()), "127.0.0.1", 0).start()
    try:
        yield srv, rec
    finally:
        srv.stop()


def _post(port: int, path: str, body: bytes, timeout: float = 10) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


def _preemptor(name: str, uid: str) -> dict[str, Any]:
    return pod(name, uid, serving=True, priority=SERVING_PRIORITY)


def _full_victims_body(preemptor: dict[str, Any], victims: dict[str, list[dict[str, Any]]]) -> bytes:
    return json.dumps(
        {
            "Pod": preemptor,
            "NodeNameToVictims": {n: {"Pods": ps, "NumPDBViolations": 0} for n, ps in victims.items()},
            "NodeNameToMetaVictims": None,
        }
    ).encode()


# ------------------------------------------------------------------------------------ High 1


def test_the_legitimate_preemption_still_suspends_the_rl_victim(served: tuple[ExtenderServer, Recorder]) -> None:
    srv, rec = served
    code, reply = _post(srv.port, "/preempt", preempt_body(_preemptor("llm-0", "u-llm"), {"n1": ["uid-rl"]}))
    assert code == 200 and reply == {"NodeNameToMetaVictims": {}} and rec.uids == ["uid-rl"]


def test_knowing_an_rl_uid_is_not_enough_the_preemptor_must_be_a_pending_pod(
    served: tuple[ExtenderServer, Recorder],
) -> None:
    """Attack: name a real RL worker's UID as the victim of a made-up preemptor (no such pod), of
    a real pod under a wrong UID, or of a pending pod that does not outrank it."""
    srv, rec = served
    for name, uid in (("ghost", "u-ghost"), ("llm-0", "u-forged"), ("low-0", "u-low")):
        code, reply = _post(srv.port, "/preempt", preempt_body(_preemptor(name, uid), {"n1": ["uid-rl"]}))
        # the RL worker is neither suspended nor handed back for eviction: its node is dropped
        assert code == 200 and reply == {"NodeNameToMetaVictims": {}}, name
    assert rec.uids == []
    refused = srv.extender.metrics.preempt_refused
    assert refused.labels("preemptor-unverified")._value.get() == 2
    assert refused.labels("not-outranked")._value.get() == 1


def test_victims_in_the_body_do_not_win_over_the_cache(served: tuple[ExtenderServer, Recorder]) -> None:
    """Attack: full victims (``NodeNameToVictims``) with the RL label: a serving pod the cache
    knows, and pods the cache does not know (any namespace/name), for a real preemptor."""
    srv, rec = served
    serving_as_rl = pod("llm-running", "uid-serving", node_name="n2", job="j")
    unknown_rl = pod("coredns-1", "uid-unknown", ns="kube-system", node_name="n2", job="j")
    body = _full_victims_body(_preemptor("llm-0", "u-llm"), {"n2": [serving_as_rl, unknown_rl]})
    code, reply = _post(srv.port, "/preempt", body)
    assert code == 200
    assert rec.uids == []  # nothing queued: neither is an RL worker the cache knows
    # kube-scheduler's own victims go back to it as UIDs (it evicts what it proposed, not us)
    victims = [{"UID": "uid-serving"}, {"UID": "uid-unknown"}]
    assert reply == {"NodeNameToMetaVictims": {"n2": {"Pods": victims, "NumPDBViolations": 0}}}


def test_twenty_calls_of_ten_thousand_victims_queue_nothing(served: tuple[ExtenderServer, Recorder]) -> None:
    """Attack: 10,000 RL-labelled victims per call (~1.6 MB), 20 times; and a call over the
    per-call victim cap."""
    srv, rec = served
    nodes = ["n1", *(f"x{j}" for j in range(9))]  # 1,000 victims on each of 10 nodes
    fake = {n: [pod(f"w-{n}-{i}", f"uid-{n}-{i}", node_name=n, job="j") for i in range(1000)] for n in nodes}
    full = _full_victims_body(_preemptor("llm-0", "u-llm"), fake)
    meta = preempt_body(_preemptor("llm-0", "u-llm"), {n: [f"uid-{n}-{i}" for i in range(1000)] for n in nodes})
    t0 = time.monotonic()
    for i in range(20):
        code, _ = _post(srv.port, "/preempt", full if i < 2 else meta)
        assert code == 200
    assert rec.uids == []
    assert time.monotonic() - t0 < 60
    over = preempt_body(
        _preemptor("llm-0", "u-llm"),
        {f"n{j}": [f"u-{j}-{i}" for i in range(wire.MAX_VICTIMS_PER_NODE)] for j in range(51)},
    )
    code, reply = _post(srv.port, "/preempt", over)
    assert code == 413 and "victims exceed" in reply["Error"]


def test_the_extender_listens_on_loopback_by_default_and_metrics_apart() -> None:
    args = cli.build_parser().parse_args([])
    assert args.listen == ("127.0.0.1", 8888)
    assert cli.build_parser().parse_args(["--metrics-listen=0.0.0.0:9888"]).metrics_listen == ("0.0.0.0", 9888)


# ------------------------------------------------------------------------------------ Medium 3


def test_a_64_mib_body_is_refused_before_it_is_read(served: tuple[ExtenderServer, Recorder]) -> None:
    srv, _ = served
    assert srv.limits.max_body == wire.max_body_bytes() < 8 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n" + b"{" * 65536)
        reply = _read_all(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"exceeds the limit" in body
    assert json.loads(body)["Error"]


# ------------------------------------------------------------------------------------ Medium 4


def _read_all(s: socket.socket, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return out


@pytest.fixture
def strict() -> Iterator[ExtenderServer]:
    limits = ServerLimits(idle_timeout_s=1.0, read_timeout_s=1.0)
    srv = ExtenderServer(Extender(_cache()), "127.0.0.1", 0, limits=limits).start()
    try:
        yield srv
    finally:
        srv.stop()


def _closed_within(s: socket.socket, seconds: float, drip: bytes = b"") -> bool:
    """True when the server closes ``s`` within ``seconds`` (sending ``drip`` every 0.2 s)."""
    deadline = time.monotonic() + seconds
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if drip:
                s.sendall(drip)
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_idle_and_slowloris_connections_are_closed(strict: ExtenderServer) -> None:
    threads_before = threading.active_count()
    idle = socket.create_connection(("127.0.0.1", strict.port))
    slow = socket.create_connection(("127.0.0.1", strict.port))
    slow.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
    assert _closed_within(idle, 4.0)
    assert _closed_within(slow, 4.0, drip=b"X")  # a header byte every 0.2 s
    idle.close()
    slow.close()
    time.sleep(0.5)
    assert threading.active_count() <= threads_before  # their threads are gone
    assert strict.extender.metrics.http_rejected.labels("timeout")._value.get() >= 2


def test_a_get_with_a_body_over_keep_alive_is_answered_once(served: tuple[ExtenderServer, Recorder]) -> None:
    srv, _ = served
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled)
        reply = _read_all(s, 2.0)
    assert reply.count(b"HTTP/1.1 ") == 1, reply


def test_oversized_headers_get_a_clean_431(served: tuple[ExtenderServer, Recorder]) -> None:
    srv, _ = served
    headers = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(60))  # ~60 KB
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        reply = _read_all(s, 2.0)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431") and "Error" in json.loads(body)


def test_a_client_that_goes_away_mid_request_leaves_no_traceback(
    served: tuple[ExtenderServer, Recorder], capfd: pytest.CaptureFixture[str]
) -> None:
    srv, _ = served
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        s.close()
    time.sleep(0.5)
    code, _ = _post(srv.port, "/filter", b'{"Pod": {}, "NodeNames": ["n1"]}')
    assert code == 200
    assert "Traceback" not in capfd.readouterr().err


def test_64_concurrent_clients_no_reset_no_5xx() -> None:
    """The bounded load test (loopback, fixed count): 64 clients x 20 calls on filter/prioritize."""
    res = extender_load.run(clients=64, calls=20, nodes=100)
    print(f"extender load: {res}")
    assert res.errors == 0, res.first_error
    assert res.server_errors == 0 and res.ok == res.calls
