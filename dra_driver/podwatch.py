"""Acts on ``rose.io/suspend-request`` annotations of this node's pods (the API-server path).

:func:`decide` is the pure decision; :class:`PodWatcher` feeds the node's pods from a
:class:`rose_common.informer.Informer` (I/O: the API server, through its :class:`PodSource`) to
the node driver. A ``DELETED`` pod is forgotten by the suspend engine, which releases the host
memory it held. The request value is JSON ``{"by","reason","graceSeconds","at"}``. A pod of a
time-slice group also carries ``rose.io/fencing-token: "<namespace>/<group>:<token>"``: an action whose token
is older than the last one the node saw for that group is refused (``NodeDriver.admit_fence``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver import fencing
from dra_driver.claims import PodRef
from dra_driver.engine_api import PodForgetter
from dra_driver.node import NodeDriver
from rose_common import names
from rose_common.informer import DELETED, Informer, InformerSettings, ListWatch
from rose_common.kube import objects

log = logging.getLogger("rose.driver.pods")


class PodSource(ListWatch, Protocol):
    """The node's pods: a list-watch transport and what to list (``dra_driver.kube.KubePods``)."""

    settings: InformerSettings


class BadSuspendRequestError(ValueError):
    pass


@dataclass(frozen=True)
class Action:
    kind: str  # "suspend" | "resume"
    pod: PodRef
    grace_seconds: float | None = None
    fencing_token: str | None = None  # "<group>:<token>" of a time-slice hand-over


def parse_request(raw: str) -> float | None:
    """The grace period of a suspend request (None: use the pod's own); refuses malformed JSON."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise BadSuspendRequestError(f"{names.ANNOTATION_SUSPEND_REQUEST} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise BadSuspendRequestError(f"{names.ANNOTATION_SUSPEND_REQUEST} must be a JSON object")
    grace = doc.get("graceSeconds")
    if grace is None:
        return None
    if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < 0:
        raise BadSuspendRequestError(f"graceSeconds must be a number >= 0, got {grace!r}")
    return float(grace)


def pod_ref(pod: dict[str, Any]) -> PodRef:
    return PodRef(namespace=objects.namespace(pod), name=objects.name(pod), uid=objects.uid(pod))


def parse_fence(pod: dict[str, Any]) -> str | None:
    """The pod's ``rose.io/fencing-token`` (None: not time-sliced); refuses a malformed one
    (``fencing.parse``: the group a time-slice group name, the token within 63 bits) and one whose
    group is not the pod's own ``rose.io/timeslice-group``: the orchestrator writes a group's token
    only on that group's workers, so a token for another group is not a hand-over of this pod."""
    raw = objects.annotations(pod).get(names.ANNOTATION_FENCING_TOKEN)
    if raw is None:
        return None
    try:
        group, _ = fencing.parse(raw)
    except ValueError as e:
        raise BadSuspendRequestError(str(e)) from e
    own = objects.labels(pod).get(names.LABEL_TIMESLICE_GROUP)
    # the orchestrator keys a group by its namespace (timeslice.state.group_key): "<namespace>/<group>"
    if own is None or group not in (own, f"{objects.namespace(pod)}/{own}"):
        raise BadSuspendRequestError(
            f"{names.ANNOTATION_FENCING_TOKEN} names group {group!r} but the pod is "
            + (f"in group {own!r}" if own else f"in no time-slice group (no {names.LABEL_TIMESLICE_GROUP} label)")
        )
    return raw


def decide(pod: dict[str, Any], held: set[str]) -> Action | None:
    if names.LABEL_JOB not in objects.labels(pod):
        return None
    ref = pod_ref(pod)
    raw = objects.annotations(pod).get(names.ANNOTATION_SUSPEND_REQUEST)
    if raw is not None and not objects.deleting(pod):
        if ref.uid in held:  # acted on already (its outcome is in rose.io/suspend-state and an Event)
            return None
        return Action("suspend", ref, parse_request(raw), parse_fence(pod))
    if ref.uid in held:
        return Action("resume", ref, fencing_token=parse_fence(pod))
    return None


def _token_order(pod: dict[str, Any]) -> int:
    """A pod's fencing token (0: none or unreadable; :func:`decide` refuses the unreadable one)."""
    try:
        raw = parse_fence(pod)
        return 0 if raw is None else fencing.parse(raw)[1]
    except (BadSuspendRequestError, ValueError):
        return 0


class PodWatcher:
    """The node's pods, listed then watched (one :class:`Informer`): each pod goes to the
    observers and to :func:`decide`; a deleted pod is forgotten by the suspend engine."""

    def __init__(
        self,
        api: PodSource,
        driver: NodeDriver,
        observers: Sequence[Callable[[dict[str, Any]], None]] = (),
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.driver = driver
        self.observers = list(observers)  # also see every pod (e.g. the CPU resizer's repair)
        # pod UID -> its time-slice group, for the node's pods that have one: the driver keeps
        # these groups' fences when its bounded fence book is full (NodeDriver.admit_fence)
        self._groups: dict[str, str] = {}
        self._groups_mu = threading.Lock()
        driver.fence_groups_in_use = self.groups_in_use
        driver.on_lent_prepared = self.recheck
        restarts = driver.metrics.watch_restarts_total
        self.informer = Informer(
            api, api.settings, self, on_restart=on_restart or (lambda kind: restarts.labels(kind).inc())
        )

    # ------------------------------------------------------------------ informer handler
    def on_list(self, items: list[dict[str, Any]]) -> None:
        with self._groups_mu:  # a (re)list is the whole truth: pods deleted unseen drop out
            self._groups.clear()
        for pod in items:
            self.handle(pod)

    def on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == DELETED:
            self.deleted(obj)
        else:
            self.handle(obj)

    # ------------------------------------------------------------------ decisions
    def groups_in_use(self) -> frozenset[str]:
        """The time-slice groups of the node's pods (label ``rose.io/timeslice-group``)."""
        with self._groups_mu:
            return frozenset(self._groups.values())

    def _track_group(self, pod: dict[str, Any], gone: bool = False) -> None:
        uid, group = objects.uid(pod), objects.labels(pod).get(names.LABEL_TIMESLICE_GROUP)
        with self._groups_mu:
            if group and not gone:
                self._groups[uid] = group
            else:
                self._groups.pop(uid, None)

    def deleted(self, pod: dict[str, Any]) -> None:
        """The pod is gone: the engine drops its workload and the host memory it held."""
        self._track_group(pod, gone=True)
        engine = self.driver.engine
        uid = objects.uid(pod)
        if not uid or not isinstance(engine, PodForgetter):
            return
        engine.forget(uid)
        log.info(
            "deleted pod forgotten by the suspend engine", extra={"pod": objects.namespaced_name(pod), "podUID": uid}
        )

    def handle(self, pod: dict[str, Any]) -> None:
        self._track_group(pod)
        for observe in self.observers:
            try:
                observe(pod)
            except Exception as e:
                log.warning("pod observer failed", extra={"pod": objects.namespaced_name(pod), "err": repr(e)})
        self._act(pod)

    def recheck(self, pods: Sequence[PodRef]) -> None:
        """A lent claim was just prepared for ``pods`` (the driver calls this before its prepare
        returns, so before the kubelet starts them): act on the suspend requests they already carry,
        read from the API server. A request the driver refused while the claim was not prepared here
        (``no-claim``) comes with no new pod event. Time-slice hand-overs are replayed in the order
        the orchestrator issued them (their fencing tokens, oldest first), so none is refused as stale."""
        found = []
        for ref in pods:
            try:
                pod = self.driver.claims.get_pod(ref.namespace, ref.name)
            except Exception as e:
                log.warning(
                    "reading a prepared claim's pod failed",
                    extra={"pod": f"{ref.namespace}/{ref.name}", "err": repr(e)},
                )
                continue
            if pod is not None and objects.uid(pod) == ref.uid and not objects.deleting(pod):
                found.append(pod)
        for pod in sorted(found, key=_token_order):
            self._act(pod)

    def _act(self, pod: dict[str, Any]) -> None:
        try:
            action = decide(pod, self.driver.held_pods())
        except BadSuspendRequestError as e:
            log.warning("bad suspend request ignored", extra={"pod": objects.namespaced_name(pod), "err": str(e)})
            self.driver.metrics.suspend_requests_total.labels("error").inc()
            return
        if action is None:
            return
        if action.fencing_token is not None and not self.driver.admit_fence(action.fencing_token, [action.pod]).ok:
            return
        if action.kind == "suspend":
            self.driver.request_suspend(action.pod, action.grace_seconds)
        else:
            self.driver.cancel_suspend(action.pod)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        self.informer.run()

    def start(self) -> threading.Thread:
        return self.informer.start()

    def stop(self) -> None:
        self.informer.stop()
