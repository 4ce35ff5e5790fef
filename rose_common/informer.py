"""List-then-watch of one kind of Kubernetes object (I/O: the API server, through a
:class:`ListWatch`, normally :class:`rose_common.kube.client.Raw`).

:class:`Informer` lists the objects (server-side label and field selectors), hands the list to
its handler, then watches from the list's ``resourceVersion`` with bookmarks, delivering
``ADDED``, ``MODIFIED`` and ``DELETED`` to the handler (bookmarks only move the resume point).
A watch the server ends normally is resumed from the last ``resourceVersion`` seen (or, with
``resync_seconds``, followed by a fresh list once that long has passed since the last one: a
level-triggered handler sees every object again); a watch that
fails (410 Gone, a connection error, a bad line, a handler error) is followed by a relist after a
backoff that doubles up to a cap and resets only once a watch has delivered an event, so a watch
that keeps failing cannot turn into a relist loop. Every relist after a failure calls the restart
hook (a metric). Lines are parsed by :mod:`rose_common.kwatch`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rose_common.kube import objects

log = logging.getLogger("rose.informer")

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"


class ListWatch(Protocol):
    """The two requests an informer makes (:class:`rose_common.kube.client.Raw` has both)."""

    def json(self, method: str, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]: ...

    def watch(self, path: str, query: dict[str, Any], timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


class Handler(Protocol):
    def on_list(self, items: list[dict[str, Any]]) -> None:
        """The full set after a (re)list: replace what was known."""
        ...

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        """One ``ADDED``, ``MODIFIED`` or ``DELETED`` object."""
        ...


@dataclass(frozen=True)
class InformerSettings:
    """What to list and watch, and how to retry. ``kind`` names the informer in logs and in the
    restart hook; ``path`` is the collection (``/api/v1/pods``)."""

    kind: str
    path: str
    label_selector: str = ""
    field_selector: str = ""
    watch_timeout_seconds: int = 300
    resync_seconds: float = 0.0  # > 0: relist after a normal watch end once this long since the last list
    bookmarks: bool = True
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"informer {self.kind}: path must be an API path like /api/v1/pods, got {self.path!r}")
        if self.watch_timeout_seconds < 1:
            raise ValueError(f"informer {self.kind}: watch_timeout_seconds must be >= 1")
        if self.resync_seconds < 0:
            raise ValueError(f"informer {self.kind}: resync_seconds must be >= 0 (0: never)")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError(f"informer {self.kind}: needs 0 < backoff_initial_s <= backoff_max_s")

    def selectors(self) -> dict[str, str]:
        q = {}
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q


class FunctionHandler:
    """A :class:`Handler` from two callables (``on_list`` defaults to an ``ADDED`` per item)."""

    def __init__(
        self,
        on_event: Callable[[str, dict[str, Any]], None],
        on_list: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self._on_event = on_event
        self._on_list = on_list

    def on_list(self, items: list[dict[str, Any]]) -> None:
        if self._on_list is not None:
            self._on_list(items)
            return
        for obj in items:
            self._on_event(ADDED, obj)

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        self._on_event(event_type, obj)


class Informer:
    def __init__(
        self,
        api: ListWatch,
        settings: InformerSettings,
        handler: Handler,
        on_restart: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.handler = handler
        self._on_restart = on_restart or (lambda kind: None)
        self.stop_event = stop or threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff = settings.backoff_initial_s

    # ------------------------------------------------------------------ one round each
    def list_once(self) -> str:
        """List, hand the items to the handler; returns the list's resourceVersion."""
        doc = self.api.json("GET", self.settings.path, self.settings.selectors())
        self.handler.on_list(objects.items(doc))
        return objects.resource_version(doc)

    def watch_once(self, resource_version: str) -> str:
        """One watch request from ``resource_version`` until the server ends it (or stop);
        returns the resourceVersion to resume from. An event (a bookmark too) resets the backoff."""
        s = self.settings
        query: dict[str, Any] = dict(s.selectors(), resourceVersion=resource_version)
        if s.bookmarks:
            query["allowWatchBookmarks"] = "true"
        rv = resource_version
        for event_type, obj in self.api.watch(s.path, query, s.watch_timeout_seconds):
            rv = objects.resource_version(obj) or rv
            self._backoff = s.backoff_initial_s  # this watch works
            if event_type != BOOKMARK:
                self.handler.on_event(event_type, obj)
            if self.stop_event.is_set():
                break
        return rv

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        s = self.settings
        while not self.stop_event.is_set():
            try:
                listed_at = time.monotonic()
                rv = self.list_once()
                while not self.stop_event.is_set():
                    rv = self.watch_once(rv)
                    if s.resync_seconds and time.monotonic() - listed_at >= s.resync_seconds:
                        break  # a normal end: list afresh (no restart, no backoff)
            except Exception as err:  # relist on anything (410 Gone included)
                if self.stop_event.is_set():
                    return
                self._on_restart(s.kind)
                backoff = self._backoff
                log.warning(
                    "watch failed, relisting", extra={"kind": s.kind, "err": str(err), "backoffSeconds": backoff}
                )
                self.stop_event.wait(backoff)
                self._backoff = min(backoff * 2, s.backoff_max_s)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.settings.kind}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self.stop_event.set()


class Listed:
    """Readiness of a component fed by informers: every named kind has been listed once.
    :meth:`wrap` marks a kind listed when its informer's list callback returns."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self._wanted = tuple(kinds)
        self._listed: set[str] = set()

    def wrap(
        self, kind: str, on_list: Callable[[list[dict[str, Any]]], None]
    ) -> Callable[[list[dict[str, Any]]], None]:
        def listed(items: list[dict[str, Any]]) -> None:
            on_list(items)
            self._listed.add(kind)

        return listed

    def ready(self) -> tuple[bool, str]:
        missing = [k for k in self._wanted if k not in self._listed]
        return (not missing, "ok" if not missing else "not listed yet: " + ", ".join(missing))
