"""The watch of the planner's reclaim DeviceTaintRules (I/O: the API server through a
:class:`rose_common.informer.ListWatch`; what this node publishes through a callable,
``SlicePublisher.set_reclaim_planned``). The decision is :func:`dra_driver.reclaimtaints.planned_reclaims`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dra_driver.reclaimtaints import Planned, planned_reclaims
from rose_common import names
from rose_common.informer import DELETED, Informer, InformerSettings, ListWatch
from rose_common.kube import objects

RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"


def rule_settings(watch_timeout_seconds: int = 60) -> InformerSettings:
    """The DeviceTaintRules the elastic controller owns (label ``rose.io/reclaim-taint-pool``)."""
    return InformerSettings(
        kind="DeviceTaintRule",
        path=RULES_PATH,
        label_selector=names.LABEL_TAINT_POOL,
        watch_timeout_seconds=watch_timeout_seconds,
        resync_seconds=watch_timeout_seconds,
        backoff_initial_s=1.0,
        backoff_max_s=30.0,
    )


class ReclaimTaintWatch:
    """Keeps the rules it has seen; after each list and event hands ``publish`` this node's
    :func:`planned_reclaims` (the publisher republishes only on a change)."""

    def __init__(
        self,
        api: ListWatch,
        node: str,
        publish: Callable[[Planned, frozenset[str]], None],
        settings: InformerSettings | None = None,
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.api, self.node, self.publish = api, node, publish
        self.settings = settings or rule_settings()
        self._rules: dict[str, dict[str, Any]] = {}
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._on_restart = on_restart

    def on_list(self, items: list[dict[str, Any]]) -> None:
        with self._mu:
            self._rules = {objects.name(r): r for r in items}
        self._push()

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        with self._mu:
            if event_type == DELETED:
                self._rules.pop(objects.name(obj), None)
            else:
                self._rules[objects.name(obj)] = obj
        self._push()

    def _push(self) -> None:
        with self._mu:
            rules = list(self._rules.values())
        planned, ruled = planned_reclaims(rules, self.node)
        self.publish(planned, ruled)

    def start(self) -> threading.Thread:
        return Informer(self.api, self.settings, self, on_restart=self._on_restart, stop=self._stop).start()

    def stop(self) -> None:
        self._stop.set()
