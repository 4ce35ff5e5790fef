"""ElasticRLJobs in a time-slice group (issue 13 §4): shared ResourceClaims, the Resident
condition read from the orchestrator's group Lease, and the single owner of
``rose.io/suspend-request`` (the orchestrator for grouped workers, the controller otherwise)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from elastic_controller import groups
from elastic_controller import observe as obs
from elastic_controller.controller import Controller, ControllerSettings, reclaim_kind
from elastic_controller.desired import desired
from elastic_controller.kube import GroupLeases, KubeJobApi
from elastic_controller.metrics import ControllerMetrics
from elastic_controller.planner import JobTarget
from elastic_controller.reconciler import converge
from elastic_controller.workers import CLAIM_NAME, shared_claim, shared_claim_name, worker_pod
from rose_common import names
from rose_common.elasticrljob import ElasticRLJob, ElasticRLJobStatus
from rose_common.informer import ADDED, DELETED, MODIFIED
from rose_common.kube.errors import Conflict, Status, Unprocessable
from rose_common.timeslice_lease import GroupLease, read
from tests.support.controller_fakes import RAW_JOB, Forecasts, Recorder, inventory
from timeslice.state import Group
from timeslice.store import to_lease

NOW = dt.datetime(2026, 11, 30, 14, 0, tzinfo=dt.UTC)
T = NOW.timestamp()


def raw_job(name: str, group: str | None = "g1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {**RAW_JOB["spec"], **({"timesliceGroup": group} if group else {})}
    meta = {**RAW_JOB["metadata"], "name": name, "uid": f"uid-{name}"}
    return {**RAW_JOB, "metadata": meta, "spec": spec, **({"status": status} if status else {})}


def job(name: str = "a", group: str | None = "g1", status: dict[str, Any] | None = None) -> ElasticRLJob:
    return ElasticRLJob.model_validate(raw_job(name, group, status))


def lease(
    holder: str = "", resident: str = "", token: int = 1, switching: bool = False, expires: float = T + 10
) -> GroupLease:
    return GroupLease("g1", holder, resident, token, switching, expires if holder else 0.0)


# ---------------------------------------------------------------- who is resident (table)

MEMBER_CASES = [
    # (lease, job, state, token)
    (None, "rl/a", "NoGrant", None),
    (lease("rl/a", "rl/a", 3), "rl/a", "Resident", 3),  # holds, its state on the devices
    (lease("", "rl/a", 3), "rl/a", "Resident", 3),  # yielded, nobody took over: lazy eviction
    (lease("rl/a", "rl/a", 3, expires=T - 1), "rl/a", "Resident", 3),  # lease expired, state still there
    (lease("rl/a", "rl/a", 3), "rl/b", "Waiting", 3),
    (lease("rl/b", "rl/a", 4, switching=True), "rl/b", "Switching", 4),  # hand-over a → b in flight
    (lease("rl/b", "rl/a", 4, switching=True), "rl/a", "Waiting", 4),  # being suspended: no longer resident
    (lease("", "", 0), "rl/a", "Waiting", 0),  # a Lease, nobody resident (a rolled-back first grant)
]


@pytest.mark.parametrize(("gl", "member", "state", "token"), MEMBER_CASES)
def test_member_state_follows_the_orchestrators_lease(
    gl: GroupLease | None, member: str, state: str, token: int | None
) -> None:
    m = groups.member_state(member, "g1", gl, T)
    assert (m.state, m.token) == (state, token)
    assert "g1" in m.message


def test_the_lease_reader_reads_what_the_orchestrator_writes() -> None:
    g = Group(
        "g1", lease_ttl_s=2.5, holder="rl/b", token=7, renewed=T, resident="rl/a", previous="rl/a", switching=True
    )
    doc = to_lease(g, "rose-system")
    assert read(doc) == GroupLease("g1", "rl/b", "rl/a", 7, True, T + 2.5)
    assert doc["metadata"]["labels"][names.LABEL_TIMESLICE_GROUP] == "g1"
    idle = to_lease(Group("g1", token=7, resident="rl/a"), "rose-system")
    assert read(idle) == GroupLease("g1", "", "rl/a", 7, False, 0.0)
    assert read({"metadata": {"name": "rose-elastic-controller"}, "spec": {}}) is None, "not a group Lease"
    bad = {**doc, "spec": {**doc["spec"], "leaseTransitions": "x"}}
    with pytest.raises(ValueError, match=r"ts-g1.*g1.*unreadable"):
        read(bad)


# ---------------------------------------------------------------- shared claims


def test_grouped_workers_reference_the_groups_shared_claim_and_ungrouped_their_template() -> None:
    a, b, solo = job("a"), job("b"), job("solo", group=None)
    claims = [[c for c in worker_pod(j, 1)["spec"]["resourceClaims"] if c["name"] == CLAIM_NAME] for j in (a, b, solo)]
    assert claims[0] == claims[1] == [{"name": CLAIM_NAME, "resourceClaimName": "ts-g1-w1-gpus"}]
    assert claims[2] == [{"name": CLAIM_NAME, "resourceClaimTemplateName": "solo-gpus"}]
    c = shared_claim(b, 1)
    assert (c["kind"], c["metadata"]["name"], c["metadata"]["namespace"]) == ("ResourceClaim", "ts-g1-w1-gpus", "rl")
    assert c["metadata"]["ownerReferences"] == [
        {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": "b",
            "uid": "uid-b",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    assert c["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    assert shared_claim_name("g1", 0) == "ts-g1-w0-gpus"
    with pytest.raises(ValueError, match=r"no spec\.timesliceGroup"):
        shared_claim(solo, 0)


def test_a_grouped_worker_is_not_pinned_to_the_planners_pool() -> None:
    # the shared claim holds every member's worker i to its node: a pool pin could name another pool
    pinned = [worker_pod(j, 0, pool="pool-b")["spec"].get("nodeSelector", {}) for j in (job("a"), job("s", group=None))]
    assert names.LABEL_POOL not in pinned[0]
    assert pinned[1][names.LABEL_POOL] == "pool-b"


def test_desired_ensures_the_shared_claims_of_new_grouped_workers_and_no_template() -> None:
    d = desired(job("a"), [], JobTarget("rl/a", active_gpus=2, add=("pool-a", "pool-a")), NOW)
    assert d.claim_template is None
    assert [c["metadata"]["name"] for c in d.claims] == ["ts-g1-w0-gpus", "ts-g1-w1-gpus"]
    solo = desired(job("solo", group=None), [], JobTarget("rl/a", active_gpus=2, add=("pool-a", "pool-a")), NOW)
    assert solo.claim_template is not None and solo.claims == ()


class ClaimRecorder(Recorder):
    def ensure_claim(self, body: dict[str, Any]) -> None:
        self.calls.append(("claim", body["metadata"]["name"]))


def test_converge_ensures_the_shared_claims_before_creating_the_pods() -> None:
    api = ClaimRecorder()
    j = job("a")
    assert converge(api, j, desired(j, [], JobTarget("rl/a", active_gpus=1, add=("pool-a",)), NOW)) == []
    kinds = [k for k, _ in api.calls if k in ("claim", "template", "create")]
    assert kinds == ["claim", "create"]


# ---------------------------------------------------------------- the suspend request's single owner


def _pod(name: str, i: int, request_by: str | None = None) -> dict[str, Any]:
    ann = {names.ANNOTATION_SUSPEND_REQUEST: json.dumps({"by": request_by})} if request_by else {}
    return {
        "metadata": {
            "name": f"{name}-w{i}",
            "uid": f"{name}-{i}",
            "labels": {names.LABEL_JOB: name},
            "annotations": ann,
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }


OWNER_CASES = [
    # (group, target suspend, target resume, pods' request owner, sets, clears)
    (None, ("a-w0",), (), None, ["a-w0"], []),  # ungrouped: the controller owns the request
    (None, (), ("a-w0",), "rose-elastic-controller", [], ["a-w0"]),
    ("g1", ("a-w0",), (), None, [], []),  # grouped, resident member: the orchestrator owns it
    ("g1", (), ("a-w0",), "rose-timeslice", [], []),  # grouped, waiting member: never resumed by the controller
    ("g1", (), ("a-w0",), "rose-elastic-controller", [], []),
]


@pytest.mark.parametrize(("group", "suspend", "resume", "by", "sets", "clears"), OWNER_CASES)
def test_the_controller_writes_no_suspend_request_on_a_grouped_worker(
    group: str | None,
    suspend: tuple[str, ...],
    resume: tuple[str, ...],
    by: str | None,
    sets: list[str],
    clears: list[str],
) -> None:
    j = job("a", group)
    observed = [w for w in (obs.observe("a", _pod("a", 0, by)),) if w is not None]
    d = desired(
        j,
        observed,
        JobTarget("rl/a", active_gpus=0, suspend=suspend, resume=resume),
        NOW,
        lease("rl/a", "rl/a") if group else None,
    )
    assert [r.pod.name for r in d.set_requests] == sets
    assert [p.name for p in d.clear_requests] == clears
    left = [e for e in d.events if e.reason == "SuspendLeftToOrchestrator"]
    assert len(left) == (1 if group else 0)


# ---------------------------------------------------------------- the status reflects the Lease


def _resident(st: ElasticRLJobStatus) -> tuple[str, str | None, dt.datetime | None]:
    (c,) = [c for c in st.conditions or [] if c.type == "Resident"]
    return c.status, c.reason, c.last_transition_time


def test_status_carries_resident_and_the_token_and_transitions_once() -> None:
    d = desired(job("a"), [], None, NOW, lease("rl/a", "rl/a", 5))
    assert _resident(d.status) == ("True", "Resident", NOW) and d.status.fencing_token == 5
    assert [e.reason for e in d.events if e.reason.startswith("Timeslice")] == ["TimesliceResident"]
    later = NOW + dt.timedelta(seconds=30)
    again = desired(
        job("a", status=d.status.model_dump(mode="json", by_alias=True, exclude_none=True)),
        [],
        None,
        later,
        lease("", "rl/a", 5),
    )
    assert _resident(again.status) == ("True", "Resident", NOW), "unchanged: lastTransitionTime kept"
    assert not [e for e in again.events if e.reason.startswith("Timeslice")]
    flipped = desired(
        job("a", status=d.status.model_dump(mode="json", by_alias=True, exclude_none=True)),
        [],
        None,
        later,
        lease("rl/b", "rl/b", 6),
    )
    assert _resident(flipped.status) == ("False", "Waiting", later) and flipped.status.fencing_token == 6
    assert [e.reason for e in flipped.events if e.reason.startswith("Timeslice")] == ["TimesliceWaiting"]
    solo = desired(job("solo", group=None), [], None, NOW)
    assert not [c for c in solo.status.conditions or [] if c.type == "Resident"] and solo.status.fencing_token is None


# ---------------------------------------------------------------- the Lease informer and the controller


def _lease_doc(holder: str, resident: str, token: int) -> dict[str, Any]:
    return to_lease(Group("g1", lease_ttl_s=30, holder=holder, token=token, renewed=T, resident=resident), "rose")


def test_group_leases_cache_notifies_the_group_on_every_change() -> None:
    changed: list[str] = []
    cache = GroupLeases(changed.append)
    h = cache.handler()
    h.on_list([_lease_doc("rl/a", "rl/a", 1), {"metadata": {"name": "other"}, "spec": {}}])
    assert changed == ["g1"] and cache.get("g1") == read(_lease_doc("rl/a", "rl/a", 1))
    h.on_event(MODIFIED, _lease_doc("rl/b", "rl/b", 2))
    assert cache.get("g1") is not None and cache.get("g1").holder == "rl/b"  # type: ignore[union-attr]
    bad = _lease_doc("rl/b", "rl/b", 2)
    bad["spec"]["renewTime"] = "not a time"
    h.on_event(MODIFIED, bad)
    assert cache.get("g1") is None, "an unreadable Lease counts as absent"
    h.on_event(ADDED, _lease_doc("rl/b", "rl/b", 2))
    h.on_event(DELETED, _lease_doc("rl/b", "rl/b", 2))
    assert cache.get("g1") is None and changed == ["g1"] * 5


def test_a_group_lease_is_found_only_in_its_own_namespace() -> None:
    """Groups are namespaced: team-b's ``g1`` is not team-a's ``g1`` (one would show the other's
    holder and fencing token in its jobs' status)."""
    cache = GroupLeases(lambda group: None)
    h = cache.handler()
    h.on_event(ADDED, to_lease(Group("team-a/g1", lease_ttl_s=30, holder="team-a/x", token=3, renewed=T), "rose"))
    h.on_event(ADDED, to_lease(Group("team-b/g1", lease_ttl_s=30, holder="team-b/y", token=9, renewed=T), "rose"))
    a, b = cache.get("g1", "team-a"), cache.get("g1", "team-b")
    assert a is not None and (a.holder, a.token) == ("team-a/x", 3)
    assert b is not None and (b.holder, b.token) == ("team-b/y", 9)
    assert cache.get("g1", "team-c") is None


class StatusRecorder(ClaimRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.statuses: dict[str, ElasticRLJobStatus] = {}

    def patch_status(self, job: ElasticRLJob, status: ElasticRLJobStatus) -> None:
        super().patch_status(job, status)
        self.statuses[job.name] = status


def _drain(ctl: Controller) -> None:
    while (key := ctl.queue.get(timeout=0)) is not None:
        ctl.reconcile(key)
        ctl.queue.done(key)


def test_two_jobs_of_a_group_share_claims_and_their_status_follows_the_lease() -> None:
    api = StatusRecorder()
    ctl = Controller(api, Forecasts(0.0), inventory, ControllerMetrics(), ControllerSettings(), clock=lambda: NOW)
    cache = GroupLeases(ctl.on_group_change)
    ctl.group_lease = cache.get
    ctl.on_job_list([raw_job("a"), raw_job("b")])
    ctl.plan_once()
    _drain(ctl)
    pods = {p["metadata"]["name"]: p for p in api.created}
    ref = {n: next(c for c in p["spec"]["resourceClaims"] if c["name"] == CLAIM_NAME) for n, p in pods.items()}
    assert ref["a-w0"] == ref["b-w0"] == {"name": CLAIM_NAME, "resourceClaimName": "ts-g1-w0-gpus"}
    assert sorted(set(api.names("claim"))) == sorted({c["resourceClaimName"] for c in ref.values()})
    assert api.names("template") == [], "no template of its own"
    assert _resident(api.statuses["a"])[1] == "NoGrant"
    cache.handler().on_event(ADDED, _lease_doc("rl/a", "rl/a", 1))  # the orchestrator granted a
    _drain(ctl)
    assert [_resident(api.statuses[n])[1] for n in ("a", "b")] == ["Resident", "Waiting"]
    cache.handler().on_event(MODIFIED, _lease_doc("rl/b", "rl/b", 2))  # a yielded, b granted
    _drain(ctl)
    assert [_resident(api.statuses[n])[1] for n in ("a", "b")] == ["Waiting", "Resident"]
    assert api.statuses["b"].fencing_token == 2


def test_a_time_slice_hand_over_is_not_counted_as_an_unplanned_reclaim() -> None:
    req, tok = names.ANNOTATION_SUSPEND_REQUEST, names.ANNOTATION_FENCING_TOKEN
    handover = json.dumps({"by": "timeslice", "reason": "time-slice hand-over 3"}, sort_keys=True)
    extender = json.dumps({"by": "rose-scheduler", "reason": "serving"})

    def pod(**ann: str) -> dict[str, Any]:
        return {"metadata": {"name": "a-w0", "annotations": ann}}

    assert reclaim_kind(pod(**{tok: "g1:2"}), pod(**{req: handover, tok: "g1:3"})) is None
    assert reclaim_kind(pod(), pod(**{req: handover, tok: "g1:1"})) is None
    assert reclaim_kind(pod(**{tok: "g1:3"}), pod(**{req: extender, tok: "g1:3"})) == "unplanned", (
        "serving's, same token"
    )
    assert reclaim_kind(pod(), pod(**{req: extender})) == "unplanned"


class ClaimServer:
    """An explicit stand-in for the API server's ResourceClaim endpoint (the e2e test uses the real
    one): the claim exists; the first ``races`` owner patches lose to another writer (a failed
    ``test`` op, 422), as a second member's or the claim controller's write does."""

    def __init__(self, races: int) -> None:
        self.races = races
        self.doc: dict[str, Any] = {
            "metadata": {
                "name": "ts-g1-w0-gpus",
                "resourceVersion": "1",
                "ownerReferences": [{"uid": "uid-a", "name": "a"}],
            }
        }

    def json(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "POST":
            raise Conflict(Status(409, "AlreadyExists"))
        if method == "GET":
            return self.doc
        assert method == "PATCH" and body[0]["value"] == self.doc["metadata"]["resourceVersion"]
        if self.races > 0:
            self.races -= 1
            rv = str(int(self.doc["metadata"]["resourceVersion"]) + 1)
            self.doc = {"metadata": {**self.doc["metadata"], "resourceVersion": rv}}
            raise Unprocessable(Status(422, "Invalid", "the test operation failed"))
        self.doc = {"metadata": {**self.doc["metadata"], "ownerReferences": body[1]["value"]}}
        return self.doc


@pytest.mark.parametrize("races", [0, 2])
def test_ensure_claim_adds_the_second_members_owner_reference_despite_a_racing_writer(races: int) -> None:
    server = ClaimServer(races)
    KubeJobApi(server).ensure_claim(shared_claim(job("b"), 0))  # type: ignore[arg-type]
    assert [o["name"] for o in server.doc["metadata"]["ownerReferences"]] == ["a", "b"]
    lost = ClaimServer(races=10)
    with pytest.raises(RuntimeError, match="owner reference of b not added after 5 attempts"):
        KubeJobApi(lost).ensure_claim(shared_claim(job("b"), 0))  # type: ignore[arg-type]
