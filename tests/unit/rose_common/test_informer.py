"""rose_common.informer through the real client transport (rose_common.kube.client.Raw) against a
small HTTP server on loopback that speaks the API server's list and watch protocol (chunked JSON
lines, ERROR events, HTTP 410). The real kube-apiserver run is in tests/e2e/rose_common/test_informer_e2e.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from rose_common.informer import Informer, InformerSettings
from rose_common.kube.client import Raw


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"u-{name}", "resourceVersion": rv}}


class WatchServer:
    """Answers LIST with ``lists`` (in turn) and each WATCH with the next script from ``watches``:
    a list of events (dicts, sent as lines) or an int (an HTTP error status)."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[list[dict[str, Any]] | int]) -> None:
        self.lists, self.watches = lists, watches
        self.requests: list[tuple[str, dict[str, str]]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                u = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                outer.requests.append((u.path, q))
                if q.get("watch") == "true":
                    script = outer.watches.pop(0) if outer.watches else []
                    if isinstance(script, int):
                        return self._send(script, {"kind": "Status", "code": script, "reason": "Expired"})
                    return self._stream(script)
                return self._send(200, outer.lists.pop(0) if len(outer.lists) > 1 else outer.lists[0])

            def _send(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, events: list[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for ev in events:
                    line = json.dumps(ev).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def raw(self) -> Raw:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.api = client.ApiClient(cfg)
        return Raw(self.api)

    def watch_queries(self) -> list[dict[str, str]]:
        return [q for _, q in self.requests if q.get("watch") == "true"]

    def list_count(self) -> int:
        return sum(1 for _, q in self.requests if q.get("watch") != "true")

    def close(self) -> None:
        self.api.close()
        self.httpd.shutdown()
        self.httpd.server_close()


class Recorder:
    def __init__(self, stop_after: int, informer: list[Informer]) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.stop_after = stop_after
        self.informer = informer

    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.lists.append([i["metadata"]["name"] for i in items])

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        self.events.append((event_type, obj["metadata"]["name"]))
        if len(self.events) >= self.stop_after:
            self.informer[0].stop()


SETTINGS = InformerSettings(
    kind="Pod",
    path="/api/v1/pods",
    label_selector="rose.io/job",
    field_selector="spec.nodeName=node-a",
    watch_timeout_seconds=5,
    backoff_initial_s=0.01,
    backoff_max_s=0.04,
)


def run(server: WatchServer, stop_after: int) -> tuple[Recorder, list[str]]:
    box: list[Informer] = []
    rec = Recorder(stop_after, box)
    restarts: list[str] = []
    box.append(Informer(server.raw(), SETTINGS, rec, on_restart=restarts.append))
    t = box[0].start()
    t.join(10)
    assert not t.is_alive(), "the informer did not stop"
    return rec, restarts


@pytest.fixture
def lists() -> list[dict[str, Any]]:
    return [
        {"metadata": {"resourceVersion": "10"}, "items": [pod("a", "9")]},
        {"metadata": {"resourceVersion": "30"}, "items": [pod("c", "29")]},
    ]


def test_list_then_watch_with_selectors_bookmarks_deleted_and_resume(lists: list[dict[str, Any]]) -> None:
    watches: list[list[dict[str, Any]] | int] = [
        [
            {"type": "ADDED", "object": pod("b", "11")},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
        ],
        [{"type": "DELETED", "object": pod("a", "16")}],
    ]
    server = WatchServer(lists, watches)
    try:
        rec, restarts = run(server, stop_after=2)
    finally:
        server.close()
    assert rec.lists == [["a"]] and rec.events == [("ADDED", "b"), ("DELETED", "a")]  # bookmarks not delivered
    assert restarts == []
    list_q = next(q for _, q in server.requests if q.get("watch") != "true")
    assert list_q == {"labelSelector": "rose.io/job", "fieldSelector": "spec.nodeName=node-a"}
    w1, w2 = server.watch_queries()
    assert w1["resourceVersion"] == "10" and w1["allowWatchBookmarks"] == "true" and w1["timeoutSeconds"] == "5"
    assert w1["labelSelector"] == "rose.io/job" and w1["fieldSelector"] == "spec.nodeName=node-a"
    assert w2["resourceVersion"] == "15"  # a normal end resumes from the bookmark, no relist
    assert server.list_count() == 1


@pytest.mark.parametrize(
    "gone",
    [
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}],
        410,  # the API server refuses the watch request itself
    ],
)
def test_gone_relists_and_counts_a_restart(lists: list[dict[str, Any]], gone: list[dict[str, Any]] | int) -> None:
    server = WatchServer(lists, [gone, [{"type": "ADDED", "object": pod("d", "31")}]])
    try:
        rec, restarts = run(server, stop_after=1)
    finally:
        server.close()
    assert rec.lists == [["a"], ["c"]] and rec.events == [("ADDED", "d")]
    assert restarts == ["Pod"]
    assert [q["resourceVersion"] for q in server.watch_queries()] == ["10", "30"]  # from the new list


class Waits(threading.Event):
    """A stop event that records the backoff waits instead of sleeping."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.waits: list[float] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


class Scripted:
    """A list-watch whose watches fail, except the ones listed in ``good`` (one event, then fail)."""

    def __init__(self, good: set[int]) -> None:
        self.good = good
        self.n = 0

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "1"}, "items": []}

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        self.n += 1
        if self.n in self.good:
            yield "MODIFIED", pod("x", str(self.n))
        raise ConnectionResetError("the watch broke")  # any failure


def test_backoff_doubles_to_its_cap_and_resets_only_after_an_event() -> None:
    stop = Waits(limit=7)
    events: list[str] = []

    class H:
        def on_list(self, items: list[dict[str, Any]]) -> None:
            pass

        def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
            events.append(event_type)

    settings = InformerSettings(kind="Pod", path="/api/v1/pods", backoff_initial_s=1.0, backoff_max_s=4.0)
    Informer(Scripted(good={5}), settings, H(), stop=stop).run()
    assert events == ["MODIFIED"]
    assert stop.waits == [1.0, 2.0, 4.0, 4.0, 1.0, 2.0, 4.0]  # the 5th watch delivered: reset


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="API path"):
        InformerSettings(kind="Pod", path="api/v1/pods")
    with pytest.raises(ValueError, match="backoff"):
        InformerSettings(kind="Pod", path="/api/v1/pods", backoff_initial_s=2, backoff_max_s=1)


def test_resync_lists_again_after_a_normal_watch_end(lists: list[dict[str, Any]]) -> None:
    """With resync_seconds (the driver's level-triggered repair), a watch the server ends normally
    is followed by a fresh list, not counted as a restart."""
    watches: list[list[dict[str, Any]] | int] = [[], [{"type": "ADDED", "object": pod("d", "31")}]]
    server = WatchServer(lists, watches)
    box: list[Informer] = []
    rec = Recorder(1, box)
    restarts: list[str] = []
    settings = InformerSettings(kind="Pod", path="/api/v1/pods", watch_timeout_seconds=5, resync_seconds=1e-6)
    box.append(Informer(server.raw(), settings, rec, on_restart=restarts.append))
    try:
        t = box[0].start()
        t.join(10)
    finally:
        server.close()
    assert rec.lists == [["a"], ["c"]] and rec.events == [("ADDED", "d")] and restarts == []
    assert [q["resourceVersion"] for q in server.watch_queries()] == ["10", "30"]
