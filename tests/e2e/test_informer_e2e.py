"""rose_common.informer against the real kube-apiserver: server-side selectors, DELETED
delivered, bookmarks that move the resume point, and a relist after 410 Gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rose_common.informer import BOOKMARK, Informer, InformerSettings
from rose_common.kube import objects
from rose_common.kube.client import Raw
from tests.k8s_helpers import delete_namespace, new_namespace, wait_for

LABEL = "rose.io/informer-e2e"


@pytest.fixture
def ns(api: Any) -> Iterator[str]:
    name = new_namespace(api, "informer")
    yield name
    delete_namespace(api, name)


class Tap:
    """The real transport, recording what passes; ``expire_first_list`` hands the informer a
    resourceVersion the API server has long forgotten (as after a long disconnect)."""

    def __init__(self, raw: Raw, expire_first_list: bool = False) -> None:
        self.raw = raw
        self.expire_first_list = expire_first_list
        self.lists = 0
        self.watch_queries: list[dict[str, Any]] = []
        self.seen: list[list[tuple[str, str]]] = []  # per watch: (type, resourceVersion) of each event

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        doc = self.raw.json(method, path, query)
        self.lists += 1
        if self.expire_first_list and self.lists == 1:
            doc["metadata"]["resourceVersion"] = "1"
        return doc

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watch_queries.append(dict(query))
        self.seen.append([])
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


def test_a_forgotten_resource_version_is_gone_and_relisted(api: Any, ns: str) -> None:
    raw = Raw(api)
    _cm(raw, ns, "a")
    tap, rec, restarts = Tap(raw, expire_first_list=True), Recorder(), []  # type: ignore[var-annotated]
    inf, thread = _start(tap, ns, rec, restarts)
    try:
        wait_for("a relist after 410 Gone", lambda: tap.lists >= 2, timeout=20)
        _cm(raw, ns, "b")
        wait_for("events after the relist", lambda: ("ADDED", "b") in rec.events, timeout=20)
    finally:
        inf.stop()
        thread.join(15)
    assert tap.watch_queries[0]["resourceVersion"] == "1"
    assert restarts == ["ConfigMap"] and rec.lists == [["a"], ["a"]]
    assert tap.watch_queries[1]["resourceVersion"] not in ("", "1")
