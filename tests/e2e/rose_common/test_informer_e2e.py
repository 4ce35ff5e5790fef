"""rose_common.informer against the real kube-apiserver: server-side selectors, DELETED
delivered, bookmarks that move the resume point, and a relist after a broken watch.

A real 410 Gone needs etcd compaction *and* the API server's watch cache to have dropped the
requested window (it serves an old resourceVersion from memory as the current state, and waits on
one from the future), which a fresh local cluster does not reach in test time; the 410 relist (as
an ERROR event and as an HTTP status) is tested against a loopback watch server in
tests/unit/rose_common/test_informer.py. Here the first watch connection breaks (injected, named below) and the
relist from the real server must bring what was missed meanwhile, a deletion included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rose_common.informer import BOOKMARK, Informer, InformerSettings
from rose_common.kube import objects
from rose_common.kube.client import Raw
from tests.support.k8s_helpers import scratch_namespace, wait_for

LABEL = "rose.io/informer-e2e"


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    with scratch_namespace(api, "informer") as name:
        yield name


class Tap:
    """The real transport, recording what passes; ``break_first_watch`` (a fake failure, the one
    thing injected) makes the first watch connection fail once it is open, after ``broken.set()``."""

    def __init__(self, raw: Raw, break_first_watch: bool = False) -> None:
        self.raw = raw
        self.break_first_watch = break_first_watch
        self.broken = threading.Event()
        self.lists = 0
        self.watch_queries: list[dict[str, Any]] = []
        self.seen: list[list[tuple[str, str]]] = []  # per watch: (type, resourceVersion) of each event

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        doc = self.raw.json(method, path, query)
        self.lists += 1
        return doc

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watch_queries.append(dict(query))
        self.seen.append([])
        if self.break_first_watch and len(self.seen) == 1:
            self.broken.wait(20)
            raise ConnectionResetError("injected: the first watch connection broke")
        for event_type, obj in self.raw.watch(path, query, timeout_seconds):
            self.seen[-1].append((event_type, objects.resource_version(obj)))
            yield event_type, obj


class Recorder:
    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.mu = threading.Lock()

    def on_list(self, items: list[dict[str, Any]]) -> None:
        with self.mu:
            self.lists.append(sorted(objects.name(i) for i in items))

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        with self.mu:
            self.events.append((event_type, objects.name(obj)))


def _cm(raw: Raw, ns: str, name: str, labelled: bool = True) -> None:
    meta: dict[str, Any] = {"name": name, "labels": {LABEL: "yes"} if labelled else {}}
    raw.json("POST", f"/api/v1/namespaces/{ns}/configmaps", body={"metadata": meta, "data": {"k": "v"}})


def _start(tap: Tap, ns: str, rec: Recorder, restarts: list[str]) -> tuple[Informer, threading.Thread]:
    settings = InformerSettings(
        kind="ConfigMap",
        path=f"/api/v1/namespaces/{ns}/configmaps",
        label_selector=f"{LABEL}=yes",
        field_selector="metadata.name!=excluded",
        watch_timeout_seconds=5,
        backoff_initial_s=0.2,
    )
    inf = Informer(tap, settings, rec, on_restart=restarts.append)
    return inf, inf.start()


def test_selectors_deleted_and_bookmarks_on_the_real_api_server(api: Any, ns: str) -> None:
    raw = Raw(api)
    _cm(raw, ns, "a")
    _cm(raw, ns, "unlabelled", labelled=False)
    tap, rec, restarts = Tap(raw), Recorder(), []  # type: ignore[var-annotated]
    inf, thread = _start(tap, ns, rec, restarts)
    try:
        wait_for("the first list", lambda: rec.lists, timeout=20)
        _cm(raw, ns, "c")
        _cm(raw, ns, "excluded")  # labelled, but the field selector leaves it out
        _cm(raw, ns, "d", labelled=False)
        raw.json("DELETE", f"/api/v1/namespaces/{ns}/configmaps/a")
        wait_for("DELETED delivered", lambda: ("DELETED", "a") in rec.events, timeout=20)
        # the server sends a bookmark shortly before it ends a watch; the next watch resumes there
        wait_for("a bookmark, then a resumed watch", lambda: len(tap.watch_queries) >= 2, timeout=20)
    finally:
        inf.stop()
        thread.join(15)
    assert not thread.is_alive()
    assert rec.lists == [["a"]] and restarts == [] and tap.lists == 1  # resumed, never relisted
    assert rec.events == [("ADDED", "c"), ("DELETED", "a")]  # selectors applied by the server
    assert tap.watch_queries[0]["allowWatchBookmarks"] == "true"
    assert [t for t, _ in tap.seen[0]].count(BOOKMARK) >= 1, f"no bookmark in the first watch: {tap.seen[0]}"
    assert tap.seen[0][-1][0] == BOOKMARK  # sent just before the server ended the watch...
    assert tap.watch_queries[1]["resourceVersion"] == tap.seen[0][-1][1]  # ...and resumed from


def test_a_broken_watch_is_relisted_with_what_it_missed(api: Any, ns: str) -> None:
    raw = Raw(api)
    _cm(raw, ns, "a")
    _cm(raw, ns, "gone-meanwhile")
    tap, rec, restarts = Tap(raw, break_first_watch=True), Recorder(), []  # type: ignore[var-annotated]
    inf, thread = _start(tap, ns, rec, restarts)
    try:
        wait_for("the first list", lambda: rec.lists, timeout=20)
        raw.json("DELETE", f"/api/v1/namespaces/{ns}/configmaps/gone-meanwhile")  # while disconnected
        _cm(raw, ns, "new-meanwhile")
        tap.broken.set()
        wait_for("a relist after the broken watch", lambda: tap.lists >= 2, timeout=30)
        _cm(raw, ns, "b")
        wait_for("events after the relist", lambda: ("ADDED", "b") in rec.events, timeout=20)
    finally:
        inf.stop()
        thread.join(15)
    assert restarts == ["ConfigMap"]
    assert rec.lists == [["a", "gone-meanwhile"], ["a", "new-meanwhile"]]  # the relist replaces the view
    assert int(tap.watch_queries[1]["resourceVersion"]) > int(tap.watch_queries[0]["resourceVersion"])
