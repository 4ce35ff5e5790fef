"""The time-slice hand-over's in-memory pod API: the pods of one group (jobs ``a`` and ``b``,
two workers each on nodes n1 and n2) and a :class:`HandoverCluster` whose nodes act on the
suspend-request annotation as the DRA driver does (one node can be made to fail)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rose_common import names
from timeslice.handover import RUNNING, SUSPENDED, PodPatch

GROUP = "grp"


def worker(job: str, i: int, node: str, state: str | None = None) -> dict[str, Any]:
    ann = {names.ANNOTATION_SUSPEND_STATE: state} if state else {}
    labels = {names.LABEL_JOB: job, names.LABEL_TIMESLICE_GROUP: GROUP}
    meta = {"namespace": "ml", "name": f"{job}-{i}", "labels": labels, "annotations": ann, "resourceVersion": "1"}
    return {"metadata": meta, "spec": {"nodeName": node}}


def group_pods(b_state: str | None = SUSPENDED) -> list[dict[str, Any]]:
    """Job a resident (running) on nodes n1 and n2; job b suspended there."""
    return [worker("a", 0, "n1"), worker("a", 1, "n2"), worker("b", 0, "n1", b_state), worker("b", 1, "n2", b_state)]


@dataclass
class HandoverCluster:
    """Pods of one group as the API server holds them; each node acts on the suspend-request
    annotation as its driver does, unless ``fail`` names the node and the state it cannot reach.
    A watch with nothing to deliver lets its whole timeout pass on the test's clock."""

    pods: dict[str, dict[str, Any]]
    fail: dict[str, str] = field(default_factory=dict)  # node -> the state it never reaches
    now: float = 1000.0
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    patches: list[PodPatch] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def list(self, group: str) -> tuple[list[dict[str, Any]], str]:
        return [dict(p) for p in self.pods.values()], "1"

    def watch(self, group: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        if not self.events:
            self.now += timeout_s
        while self.events:
            yield self.events.pop(0)

    def patch(self, patch: PodPatch) -> None:
        self.patches.append(patch)
        pod = self.pods[patch.key()]
        ann = dict(pod["metadata"]["annotations"])
        for k, v in patch.annotations.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        want = SUSPENDED if names.ANNOTATION_SUSPEND_REQUEST in ann else RUNNING
        if self.fail.get(pod["spec"]["nodeName"]) != want:
            ann[names.ANNOTATION_SUSPEND_STATE] = want
        pod = {"metadata": dict(pod["metadata"], annotations=ann), "spec": pod["spec"]}
        self.pods[patch.key()] = pod
        self.events.append(("MODIFIED", pod))

    def state(self, key: str) -> str:
        return str(self.pods[key]["metadata"]["annotations"].get(names.ANNOTATION_SUSPEND_STATE, RUNNING))
