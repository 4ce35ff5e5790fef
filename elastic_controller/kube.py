"""The controller's only module that talks to the API server.

I/O boundary: HTTP requests to the API server through :class:`rose_common.kube.client.Raw`
(plain JSON, typed errors). :class:`KubeJobApi` implements the reconciler's ``JobApi``
Protocol: create and delete worker Pods and the job's ResourceClaimTemplate (a create that
conflicts is success; a delete carries the pod's UID as a precondition, a pod recreated under
the same name is never touched), patch the driver's ``rose.io/suspend-request`` annotation
(with a UID test, so it never lands on a recreated pod), write the status subresource (under
the resourceVersion it was computed from: :func:`status_patch`) and
record core/v1 Events on the job. :func:`informers` lists and watches ElasticRLJobs and the
worker Pods by a **server-side** label selector (``rose.io/elastic-rl-job``), so the pods of
the serving cluster never reach this process. :class:`LeaseLock` reads and writes the
coordination.k8s.io/v1 Lease of leader election; the decision itself is
:func:`elastic_controller.leader.decide` (pure). :class:`InventoryStore`, filled by
:func:`inventory_informers`, keeps the pool nodes' pools and the driver's ResourceSlices'
device counts and serves the planner's capacities per pool. :class:`GroupLeases`, filled by
:func:`group_informers`, holds the time-slice orchestrator's group Leases (label
``rose.io/timeslice-group``, in the controller's Lease namespace), read only;
:meth:`KubeJobApi.ensure_claim` creates a group's shared ResourceClaim or adds the job's owner
reference to it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

from elastic_controller import pools
from elastic_controller.desired import PodRef
from elastic_controller.leader import LeaseRecord
from elastic_controller.reconciler import StatusConflict
from elastic_controller.status import EventSpec
from elastic_controller.workers import CONTROLLER
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus
from rose_common.informer import FunctionHandler, Handler, Informer, InformerSettings
from rose_common.kube import objects
from rose_common.kube.client import Raw
from rose_common.kube.errors import Conflict, NotFound, Unprocessable
from rose_common.timefmt import rfc3339
from rose_common.timeslice_lease import LABEL_GROUP, GroupLease
from rose_common.timeslice_lease import read as read_group_lease

JOBS_PATH: Final = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
RCT_API: Final = "/apis/resource.k8s.io/v1"
log = logging.getLogger(__name__)
LEASE_API: Final = "/apis/coordination.k8s.io/v1"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"


def _q(s: str) -> str:
    return quote(s, safe="")


def _pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{_q(namespace)}/pods"
    return f"{base}/{_q(name)}" if name else base


def _job_path(namespace: str, name: str) -> str:
    return f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{_q(namespace)}/{names.PLURAL}/{_q(name)}"


def job_event(job: ElasticRLJob, event: EventSpec, now: dt.datetime, host: str = "") -> dict[str, Any]:
    """A core/v1 Event on the ElasticRLJob (pure)."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{job.name}.", "namespace": job.namespace},
        "involvedObject": {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": job.name,
            "namespace": job.namespace,
            "uid": job.uid,
        },
        "reason": event.reason[:128],
        "message": event.message[:1024],
        "type": event.type,
        "source": {"component": CONTROLLER},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": CONTROLLER,
        "reportingInstance": host or CONTROLLER,
    }


def annotation_patch(pod: PodRef, value: str | None) -> list[dict[str, Any]]:
    """A JSON patch that sets (or removes) the suspend request only on the pod with this UID (pure)."""
    key = names.ANNOTATION_SUSPEND_REQUEST.replace("~", "~0").replace("/", "~1")
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": pod.uid}]
    if value is None:
        return [*ops, {"op": "remove", "path": f"/metadata/annotations/{key}"}]
    return [*ops, {"op": "add", "path": f"/metadata/annotations/{key}", "value": value}]


def status_patch(job: ElasticRLJob, status: ElasticRLJobStatus) -> dict[str, Any]:
    """The merge patch of the status subresource (pure). It carries the ``resourceVersion`` the
    status was computed from, when the job has one: the API server refuses it (409) once the job
    has changed since, so a status computed from a stale view never overwrites a newer one."""
    body: dict[str, Any] = {"status": status.model_dump(mode="json", exclude_none=True, by_alias=True)}
    if job.resource_version:
        body["metadata"] = {"resourceVersion": job.resource_version}
    return body


class EventQueue:
    """Events POSTed in order by one background thread, as client-go's recorder does: a reconcile
    (and so the next job's suspend requests) never waits on an Event. Best effort: an Event that
    fails, or finds the queue full, is logged and dropped."""

    def __init__(self, post: Callable[[dict[str, Any]], object], maxsize: int = 10_000) -> None:
        self._q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize)
        self._post = post
        threading.Thread(target=self._run, name="events", daemon=True).start()

    def put(self, body: dict[str, Any]) -> None:
        try:
            self._q.put_nowait(body)
        except queue.Full:
            log.warning("event dropped: queue full", extra={"reason": body.get("reason")})

    def _run(self) -> None:
        while True:
            body = self._q.get()
            try:
                self._post(body)
            except Exception as e:  # best effort, as the recorder's
                log.warning("event not recorded", extra={"reason": body.get("reason"), "err": repr(e)})
            finally:
                self._q.task_done()

    def join(self) -> None:
        """Wait until every queued Event has been posted (or dropped)."""
        self._q.join()


class KubeJobApi:
    """The reconciler's ``JobApi`` against the API server (Events through an :class:`EventQueue`
    when ``background_events``)."""

    def __init__(
        self, raw: Raw, host: str = "", clock: Callable[[], dt.datetime] | None = None, background_events: bool = False
    ) -> None:
        self.raw = raw
        self.host = host
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._events = EventQueue(self._post_event) if background_events else None

    def ensure_claim_template(self, body: dict[str, Any]) -> None:
        ns = objects.namespace(body)
        with contextlib.suppress(Conflict):  # exists: the template is immutable and named after the job
            self.raw.json("POST", f"{RCT_API}/namespaces/{_q(ns)}/resourceclaimtemplates", body=body)

    def ensure_service(self, body: dict[str, Any]) -> None:
        """Create a job's trainer Service; one that exists (named after the job, owned by it) is kept."""
        with contextlib.suppress(Conflict):
            self.raw.json("POST", f"/api/v1/namespaces/{_q(objects.namespace(body))}/services", body=body)

    def ensure_claim(self, body: dict[str, Any], attempts: int = 5) -> None:
        """Create a time-slice group's shared ResourceClaim; when it exists, add this job's owner
        reference (a JSON patch that tests the read resourceVersion). A write that lost a race (the
        other member's, the claim controller's) is read and tried again, ``attempts`` times in all:
        the reconcile that creates the pods is the only one that ensures their claims."""
        path = f"{RCT_API}/namespaces/{_q(objects.namespace(body))}/resourceclaims"
        mine = body["metadata"]["ownerReferences"][0]
        for _ in range(attempts):
            try:
                self.raw.json("POST", path, body=body)
                return
            except Conflict:
                pass
            doc = self.raw.json("GET", f"{path}/{_q(objects.name(body))}")
            owners = objects.meta(doc).get("ownerReferences") or []
            if any(isinstance(o, dict) and o.get("uid") == mine["uid"] for o in owners):
                return
            ops = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": objects.resource_version(doc)},
                {"op": "add", "path": "/metadata/ownerReferences", "value": [*owners, mine]},
            ]
            try:
                self.raw.json("PATCH", f"{path}/{_q(objects.name(body))}", body=ops, content_type=JSON_PATCH)
                return
            except (Conflict, Unprocessable, NotFound):  # changed or deleted since the read: again
                continue
        raise RuntimeError(
            f"ResourceClaim {objects.name(body)}: owner reference of {mine['name']} not added after "
            f"{attempts} attempts: the claim kept changing"
        )

    def create_pod(self, body: dict[str, Any]) -> None:
        with contextlib.suppress(Conflict):  # created before a crash or a lost reply: the fixed name is idempotent
            self.raw.json("POST", _pod_path(objects.namespace(body)), body=body)

    def delete_pod(self, namespace: str, pod: PodRef) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": pod.uid}}
        try:
            self.raw.json("DELETE", _pod_path(namespace, pod.name), body=body)
        except NotFound:
            pass
        except Conflict:
            pass  # another pod now has the name: not ours to delete

    def delete_claim_template(self, namespace: str, name: str, owner_uid: str) -> None:
        """Delete the template ``name`` only if the job with ``owner_uid`` owns it (UID precondition)."""
        path = f"{RCT_API}/namespaces/{_q(namespace)}/resourceclaimtemplates/{_q(name)}"
        try:
            doc = self.raw.json("GET", path)
        except NotFound:
            return
        owners = objects.meta(doc).get("ownerReferences") or []
        if not any(isinstance(o, dict) and o.get("uid") == owner_uid for o in owners):
            return  # a new job of the same name owns it now
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": objects.uid(doc)}}
        with contextlib.suppress(NotFound, Conflict):
            self.raw.json("DELETE", path, body=body)

    def set_suspend_request(self, namespace: str, pod: PodRef, value: str | None) -> None:
        path = _pod_path(namespace, pod.name)
        try:
            self.raw.json("PATCH", path, body=annotation_patch(pod, value), content_type=JSON_PATCH)
        except NotFound:
            pass
        except Unprocessable:
            if value is None:
                return  # the annotation is already gone (or the pod is another one): nothing of ours left
            # the pod has no annotations map yet; the UID test still guards the whole-map add
            ops = [
                *annotation_patch(pod, value)[:1],
                {"op": "add", "path": "/metadata/annotations", "value": {names.ANNOTATION_SUSPEND_REQUEST: value}},
            ]
            self.raw.json("PATCH", path, body=ops, content_type=JSON_PATCH)

    def annotate_pod(self, namespace: str, pod: PodRef, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into pod ``pod`` (only while it has this UID)."""
        body = {"metadata": {"uid": pod.uid, "annotations": annotations}}
        with contextlib.suppress(NotFound, Conflict, Unprocessable):  # gone, or another pod has the name
            self.raw.json("PATCH", _pod_path(namespace, pod.name), body=body, content_type=MERGE_PATCH)

    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None:
        """Write ``status`` under the job's resourceVersion (:func:`status_patch`); a job changed
        since raises :class:`~elastic_controller.reconciler.StatusConflict`."""
        path = _job_path(job.namespace, job.name) + "/status"
        try:
            self.raw.json("PATCH", path, body=status_patch(job, status), content_type=MERGE_PATCH)
        except NotFound:  # the job was deleted meanwhile
            return
        except Conflict as e:
            raise StatusConflict(
                f"ElasticRLJob {job.namespace}/{job.name} changed since resourceVersion {job.resource_version}"
            ) from e

    def record_event(self, job: ElasticRLJob, event: EventSpec) -> None:
        body = job_event(job, event, self._clock(), self.host)
        if self._events is not None:
            self._events.put(body)
        else:
            self._post_event(body)

    def _post_event(self, body: dict[str, Any]) -> None:
        self.raw.json("POST", f"/api/v1/namespaces/{_q(body['metadata']['namespace'])}/events", body=body)


# ---------------------------------------------------------------------- inventory for the planner


class InventoryStore:
    """Each pool node's pool and each driver ResourceSlice's ``(node, lendable devices)``, as two
    informers keep them (see :func:`inventory_informers`): the plan reads the capacities without
    a request. Listing both on every plan (about 9.5 MB at 1,000 nodes, seconds on a loaded API
    server) made every planned reclaim that much slower, and counting 16,000 devices per plan
    cost ~60 ms (``benchmarks/controller_scale.py``): a slice's devices are counted once, when
    its event arrives, and the per-pool sums are kept until the next change."""

    KINDS: Final = ("Node", "ResourceSlice")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool_of: dict[str, str] = {}  # node name → its rose.io/gpu-pool label
        self._slices: dict[str, tuple[str, int]] = {}  # slice name → (node name, lendable devices)
        self._synced: set[str] = set()
        self._sums: dict[str, int] | None = None  # None: changed since the last sum
        self._memory: dict[str, int] = {}  # slice name → its largest lendable device's memory (bytes)
        self._devices: dict[str, tuple[str, tuple[str, ...]]] = {}  # slice name → (node, lendable device names)
        self._held: dict[str, frozenset[tuple[str, str]]] = {}  # slice name → its serving-held (pool, device)
        self._lent: dict[str, frozenset[int] | None] = {}  # node name → GPUs with a lent claim prepared

    def _put(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "Node":
            self._pool_of[objects.name(obj)] = objects.labels(obj).get(names.LABEL_POOL, "")
            self._lent[objects.name(obj)] = pools.lent_gpus(obj)
        elif (entry := pools.lendable_on(obj)) is not None:
            self._slices[objects.name(obj)] = entry
            self._memory[objects.name(obj)] = pools.lendable_memory(obj)
            self._devices[objects.name(obj)] = pools.lendable_devices(obj) or ("", ())
            self._held[objects.name(obj)] = pools.serving_held(obj)
        else:
            self._drop_slice(objects.name(obj))

    def _drop_slice(self, name: str) -> None:
        for d in (self._slices, self._memory, self._devices, self._held):
            d.pop(name, None)

    def handler(self, kind: str) -> FunctionHandler:
        def on_list(items: list[dict[str, Any]]) -> None:
            with self._lock:
                if kind == "Node":
                    self._pool_of.clear()
                    self._lent.clear()
                else:
                    for d in (self._slices, self._memory, self._devices, self._held):
                        d.clear()
                for o in items:
                    self._put(kind, o)
                self._synced.add(kind)
                self._sums = None

        def on_event(event_type: str, obj: dict[str, Any]) -> None:
            with self._lock:
                if event_type == "DELETED" and kind == "Node":
                    self._pool_of.pop(objects.name(obj), None)
                    self._lent.pop(objects.name(obj), None)
                elif event_type == "DELETED":
                    self._drop_slice(objects.name(obj))
                else:
                    self._put(kind, obj)
                self._sums = None

        return FunctionHandler(on_event, on_list)

    def __call__(self) -> dict[str, int]:
        """Physical GPUs per pool (:func:`elastic_controller.pools.sum_capacities`); raises
        ``RuntimeError`` until both kinds have been listed once."""
        with self._lock:
            if len(self._synced) < len(self.KINDS):
                raise RuntimeError("pool inventory not listed yet (nodes and ResourceSlices)")
            if self._sums is None:
                self._sums = pools.sum_capacities(self._pool_of, self._slices.values())
            return dict(self._sums)

    def lendable_devices(self) -> dict[str, list[tuple[str, str]]]:
        """Per pool, the ``(node, device)`` of every lendable device the driver publishes there."""
        with self._lock:
            out: dict[str, list[tuple[str, str]]] = {}
            for node, devs in self._devices.values():
                pool = self._pool_of.get(node, "")
                if pool:
                    out.setdefault(pool, []).extend((node, d) for d in devs)
            return out

    def serving_held(self) -> frozenset[tuple[str, str]]:
        """Every lendable ``(pool, device)`` the driver's slices mark ``rose.io/serving-holds``."""
        with self._lock:
            return frozenset().union(*self._held.values())

    def lent_gpus(self, node: str) -> frozenset[int] | None:
        """The GPUs of ``node`` with a lent claim prepared, as its driver publishes them; None: unknown."""
        with self._lock:
            return self._lent.get(node)

    def device_memory(self) -> int | None:
        """The most memory one lendable GPU of the cluster has (bytes), from the driver's slices;
        None when no slice publishes it. A worker's reported state is bounded by it."""
        with self._lock:
            return max(self._memory.values(), default=0) or None

    def smallest_device_memory(self) -> int | None:
        """The least memory one lendable GPU of the cluster has (bytes; each slice's largest, the
        smallest of those), None when no slice publishes it: a GPU share's memory fraction is taken
        of it, so a share's size is never understated."""
        with self._lock:
            return min((m for m in self._memory.values() if m > 0), default=0) or None


def inventory_informers(
    raw: Raw, store: InventoryStore, on_restart: Callable[[str], None], stop: threading.Event
) -> list[Informer]:
    """The nodes of GPU pools and the ROSE driver's ResourceSlices (both selected server-side), into ``store``."""
    nodes = InformerSettings(
        kind="Node", path="/api/v1/nodes", label_selector=names.LABEL_POOL, watch_timeout_seconds=300
    )
    slices = InformerSettings(
        kind="ResourceSlice",
        path=f"{RCT_API}/resourceslices",
        field_selector=f"spec.driver={names.DRIVER_NAME}",
        watch_timeout_seconds=300,
    )
    return [
        Informer(raw, nodes, store.handler("Node"), on_restart, stop),
        Informer(raw, slices, store.handler("ResourceSlice"), on_restart, stop),
    ]


class ClaimAllocations:
    """The devices each lent claim is allocated (``(pool, device)`` of ``status.allocation``),
    read with one GET per claim and kept ``ttl_s`` (an allocation does not change while the claim
    is reserved; a shared claim deallocated and allocated again shows after the TTL). Read only
    for workers on a node where serving holds a lendable device, so a quiet cluster reads none."""

    def __init__(self, raw: Raw, ttl_s: float = 30.0, clock: Callable[[], float] | None = None) -> None:
        self.raw = raw
        self.ttl_s = ttl_s
        self._clock = clock or time.monotonic
        self._cache: dict[tuple[str, str], tuple[float, tuple[tuple[str, str], ...] | None]] = {}

    def get(self, namespace: str, name: str) -> tuple[tuple[str, str], ...] | None:
        """None: not found or not allocated (yet)."""
        now = self._clock()
        hit = self._cache.get((namespace, name))
        if hit is not None and now - hit[0] < self.ttl_s and hit[1] is not None:
            return hit[1]
        try:
            claim = self.raw.json("GET", f"{RCT_API}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}")
        except NotFound:
            claim = {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        out = tuple((str(r.get("pool", "")), str(r.get("device", ""))) for r in results) or None
        self._cache[(namespace, name)] = (now, out)
        if len(self._cache) > 4096:  # claims of deleted workers: forget the oldest half
            for key in sorted(self._cache, key=lambda k: self._cache[k][0])[:2048]:
                del self._cache[key]
        return out


# ---------------------------------------------------------------------- leader election


class LeaseLock:
    """Reads and writes one coordination.k8s.io/v1 Lease."""

    def __init__(self, raw: Raw, namespace: str, name: str) -> None:
        self.raw = raw
        self.path = f"{LEASE_API}/namespaces/{_q(namespace)}/leases"
        self.namespace = namespace
        self.name = name

    def get(self) -> tuple[LeaseRecord | None, str]:
        """The lease's record and resourceVersion ((None, "") when there is none)."""
        try:
            doc = self.raw.json("GET", f"{self.path}/{_q(self.name)}")
        except NotFound:
            return None, ""
        return LeaseRecord.from_spec(dict(objects.spec(doc))), objects.resource_version(doc)

    def write(self, record: LeaseRecord, resource_version: str) -> bool:
        """Create (no resourceVersion) or replace under the read resourceVersion; False on a conflict."""
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        try:
            if resource_version:
                body["metadata"]["resourceVersion"] = resource_version
                self.raw.json("PUT", f"{self.path}/{_q(self.name)}", body=body)
            else:
                self.raw.json("POST", self.path, body=body)
        except Conflict:
            return False  # another replica wrote first
        return True


# ---------------------------------------------------------------------- informers


def informers(
    raw: Raw,
    on_job: Handler,
    on_pod: Handler,
    on_restart: Callable[[str], None],
    stop: threading.Event,
    resync_seconds: float = 300.0,
) -> list[Informer]:
    """ElasticRLJobs in every namespace, and only the worker Pods (label selected by the server)."""
    jobs = InformerSettings(kind=names.KIND, path=JOBS_PATH, watch_timeout_seconds=60, resync_seconds=resync_seconds)
    pods = InformerSettings(
        kind="Pod",
        path="/api/v1/pods",
        label_selector=names.LABEL_JOB,
        watch_timeout_seconds=60,
        resync_seconds=resync_seconds,
    )
    return [Informer(raw, jobs, on_job, on_restart, stop), Informer(raw, pods, on_pod, on_restart, stop)]


# ---------------------------------------------------------------------- time-slice groups (read only)


class GroupLeases:
    """The orchestrator's group Leases as an informer keeps them; ``on_change(group)`` after each
    change (the controller requeues the group's member jobs). An unreadable Lease is logged and
    counts as absent."""

    def __init__(self, on_change: Callable[[str], None]) -> None:
        self._lock = threading.Lock()
        self._by_lease: dict[str, GroupLease] = {}
        self._on_change = on_change

    @staticmethod
    def _read(obj: dict[str, Any]) -> GroupLease | None:
        try:
            return read_group_lease(obj)
        except ValueError as e:
            log.warning("time-slice group lease unreadable", extra={"lease": objects.name(obj), "err": str(e)})
            return None

    def handler(self) -> FunctionHandler:
        def on_list(items: list[dict[str, Any]]) -> None:
            fresh = {objects.name(o): g for o in items if (g := self._read(o)) is not None}
            with self._lock:
                old, self._by_lease = self._by_lease, fresh
            for group in {g.group for g in (*old.values(), *fresh.values())}:
                self._on_change(group)

        def on_event(event_type: str, obj: dict[str, Any]) -> None:
            g = None if event_type == "DELETED" else self._read(obj)
            with self._lock:
                old = self._by_lease.pop(objects.name(obj), None)
                if g is not None:
                    self._by_lease[objects.name(obj)] = g
            for group in {x.group for x in (old, g) if x is not None}:
                self._on_change(group)

        return FunctionHandler(on_event, on_list)

    def get(self, group: str, namespace: str = "") -> GroupLease | None:
        """The Lease of ``group`` in ``namespace``: groups are namespaced (the orchestrator keys them
        ``namespace/group``), so another namespace's group of the same name is not this one. A Lease
        without a namespace (an orchestrator run outside Kubernetes) counts only when none has it."""
        with self._lock:
            mine = [g for g in self._by_lease.values() if g.group == group and g.namespace in (namespace, "")]
        return next((g for g in mine if g.namespace == namespace), mine[0] if mine else None)


def group_informers(
    raw: Raw, namespace: str, leases: GroupLeases, on_restart: Callable[[str], None], stop: threading.Event
) -> list[Informer]:
    """The time-slice orchestrator's group Leases in ``namespace`` (label selected by the server)."""
    settings = InformerSettings(
        kind="Lease",
        path=f"{LEASE_API}/namespaces/{_q(namespace)}/leases",
        label_selector=LABEL_GROUP,
        watch_timeout_seconds=300,
    )
    return [Informer(raw, settings, leases.handler(), on_restart, stop)]


class KubeTaintRules:
    """The DeviceTaintRules this controller owns (label ``rose.io/reclaim-taint-pool``)."""

    PATH: Final = f"{RCT_API}/devicetaintrules"

    def __init__(self, raw: Raw) -> None:
        self.raw = raw

    def list(self) -> list[dict[str, Any]]:
        return objects.items(self.raw.json("GET", self.PATH, {"labelSelector": names.LABEL_TAINT_POOL}))

    def create(self, body: dict[str, Any]) -> None:
        with contextlib.suppress(Conflict):  # there already: what we wanted
            self.raw.json("POST", self.PATH, body=body)

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.raw.json("DELETE", f"{self.PATH}/{name}")
