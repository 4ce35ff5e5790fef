"""Worker Pods and the per-job ResourceClaimTemplate (or, for a job in a time-slice group, the
group's shared ResourceClaims) of an ElasticRLJob, as plain API objects.

I/O boundary: none. Pure functions of the validated job (``rose_common.elasticrljob``) to JSON
dicts that ``kube.py`` will create; no client, no clock. What the other components read:

- the extender: label ``rose.io/elastic-rl-job``, the owner reference, ``schedulerName:
  rose-scheduler``, annotations ``rose.io/gpus``, ``rose.io/min-useful-run-seconds``,
  ``rose.io/graceful-shutdown-seconds`` and ``rose.io/state-bytes``;
- the DRA driver: the lendable claim (device class ``lendable.gpu.rose.io``, ``gpusPerWorker``
  devices) and the grace period annotation; with ``spec.timesliceGroup`` worker ``i`` of every
  member job references the one claim ``ts-<group>-w<i>-gpus`` (:func:`shared_claim`);
- the SDK in the worker: ``ROSE_POD_UID``/``NAME``/``NAMESPACE`` (downward API),
  ``ROSE_CHECKPOINT_PATH`` with ``ROSE_RESTORE=latest`` (restore from it on start, when one
  exists), ``ROSE_JOB_NAME``, ``ROSE_WORKER_INDEX``, ``ROSE_MIN_WORKERS`` and
  ``ROSE_MAX_WORKERS``.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Final

from rose_common import extender_names, names
from rose_common.elasticrljob import ElasticRLJob, Role

CONTROLLER: Final = "rose-elastic-controller"
ROLE_RL_WORKER: Final = "rl-worker"
LABEL_WORKER_INDEX: Final = f"{names.LABEL_PREFIX}/worker-index"
CLAIM_NAME: Final = "gpus"  # the pod's claim entry and the template's request
RESOURCE_API: Final = "resource.k8s.io/v1"
_SUFFIX_RE = re.compile(r"^(?:w(?P<index>\d+)|(?P<role>trainer|rollout)-(?P<rindex>\d+))$")
LABEL_RL_ROLE: Final = f"{names.LABEL_PREFIX}/rl-role"  # "trainer" | "rollout" (a job with spec.roles)
ENV_ROLE: Final = "ROSE_ROLE"
ENV_ROLE_INDEX: Final = "ROSE_ROLE_INDEX"
ENV_TRAINER_ADDR: Final = "ROSE_TRAINER_ADDR"
MAX_NAME: Final = 63
RESTORE_ENV: Final = "ROSE_RESTORE"  # read by rose_sdk.checkpoint.restore_requested
RESTORE_LATEST: Final = "latest"


def worker_name(job: str, index: int, role: Role | None = None) -> str:
    """``<job>-w<index>``, or ``<job>-<role>-<index>`` for a role of a job with ``spec.roles``."""
    name = f"{job}-w{index}" if role is None else f"{job}-{role}-{index}"
    if len(name) > MAX_NAME:
        raise ValueError(f"worker name {name!r} is longer than {MAX_NAME} characters; shorten the job's name")
    return name


def worker_index(job: str, pod_name: str) -> int | None:
    """The index in ``<job>-w<index>`` (or in ``<job>-<role>-<index>``), or None for a pod this
    controller did not name."""
    parsed = worker_role_index(job, pod_name)
    return parsed[1] if parsed is not None else None


def worker_role_index(job: str, pod_name: str) -> tuple[Role | None, int] | None:
    """(role, index) of a worker name of ``job`` (role None: ``<job>-w<index>``), or None."""
    if not pod_name.startswith(job + "-"):
        return None
    m = _SUFFIX_RE.match(pod_name[len(job) + 1 :])
    if m is None:
        return None
    if m["index"] is not None:
        return None, int(m["index"])
    role: Role = "trainer" if m["role"] == "trainer" else "rollout"
    return role, int(m["rindex"])


def trainer_service_name(job: str) -> str:
    """The headless Service of a job's trainer workers (their DNS subdomain)."""
    return f"{job}-trainer"


def trainer_addr(job: ElasticRLJob) -> str:
    """``host:port`` of trainer worker 0, as the rollout workers get it in ``ROSE_TRAINER_ADDR``."""
    assert job.spec.roles is not None
    host = f"{worker_name(job.name, 0, 'trainer')}.{trainer_service_name(job.name)}.{job.namespace}.svc"
    return f"{host}:{job.spec.roles.trainer.port}"


def trainer_service(job: ElasticRLJob) -> dict[str, Any]:
    """The headless Service that gives each trainer worker a DNS name (pod ``hostname`` +
    ``subdomain``): ``<job>-trainer-<i>.<job>-trainer.<namespace>.svc``; owned by the job."""
    if job.spec.roles is None:
        raise ValueError(f"ElasticRLJob {job.namespace}/{job.name} has no spec.roles; it has no trainer Service")
    port = job.spec.roles.trainer.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": trainer_service_name(job.name),
            "namespace": job.namespace,
            "labels": {names.LABEL_JOB: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_JOB: job.name, LABEL_RL_ROLE: "trainer"},
            "ports": [{"name": "trainer", "port": port, "targetPort": port}],
        },
    }


def claim_template_name(job: str, role: Role | None = None) -> str:
    return f"{job}-{CLAIM_NAME}" if role is None else f"{job}-{role}-{CLAIM_NAME}"


def owner_reference(job: ElasticRLJob) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _claim_request(job: ElasticRLJob, role: Role | None) -> dict[str, Any]:
    """The template's one request: ``gpusPerWorker`` lendable devices, or with ``spec.gpuShare`` one
    share device (DeviceClass ``share.gpu.rose.io``) with the share's capacities requested."""
    share = job.spec.gpu_share
    if share is None:
        return {
            "name": CLAIM_NAME,
            "exactly": {
                "deviceClassName": names.DEVICE_CLASS_LENDABLE,
                "allocationMode": "ExactCount",
                "count": job.spec.role_gpus_per_worker(role),
            },
        }
    requests = {names.CAPACITY_MEMORY: share.memory, names.CAPACITY_COMPUTE: str(share.compute)}
    return {
        "name": CLAIM_NAME,
        "exactly": {
            "deviceClassName": names.DEVICE_CLASS_SHARE,
            "allocationMode": "ExactCount",
            "count": 1,
            "capacity": {"requests": requests},
        },
    }


def claim_template(job: ElasticRLJob, role: Role | None = None) -> dict[str, Any]:
    """One ResourceClaimTemplate per job (per lent role of a job with roles, ``<job>-<role>-gpus``):
    ``gpusPerWorker`` lendable devices per worker, or one GPU share (``spec.gpuShare``)."""
    request = _claim_request(job, role)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(job.name, role),
            "namespace": job.namespace,
            "labels": {names.LABEL_JOB: job.name},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def shared_claim_name(group: str, index: int) -> str:
    """The ResourceClaim every member of time-slice ``group`` uses for worker slot ``index``."""
    return f"ts-{group}-w{index}-{CLAIM_NAME}"


def shared_claim(job: ElasticRLJob, index: int) -> dict[str, Any]:
    """Worker slot ``index``'s ResourceClaim of the job's time-slice group: the group's members
    reference it by ``resourceClaimName`` (DRA reserves one allocated claim for up to 256 pods,
    ``status.reservedFor``), so they share its devices and the orchestrator decides whose state is
    resident. Each member adds its own (non-controller) owner reference: the garbage collector
    deletes the claim once every member job is gone."""
    group = job.spec.timeslice_group
    if group is None:
        raise ValueError(f"ElasticRLJob {job.namespace}/{job.name} has no spec.timesliceGroup; it has no shared claim")
    request = {
        "name": CLAIM_NAME,
        "exactly": {
            "deviceClassName": names.DEVICE_CLASS_LENDABLE,
            "allocationMode": "ExactCount",
            "count": job.spec.gpus_per_worker,
        },
    }
    owner = {**owner_reference(job), "controller": False, "blockOwnerDeletion": False}
    meta = {
        "name": shared_claim_name(group, index),
        "namespace": job.namespace,
        "labels": {names.LABEL_TIMESLICE_GROUP: group, LABEL_WORKER_INDEX: str(index)},
        "ownerReferences": [owner],
    }
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [request]}},
    }


def _pod_claim(job: ElasticRLJob, index: int, role: Role | None = None) -> dict[str, Any]:
    """The pod's claim entry: the group's shared claim for a time-sliced job, else the job's template."""
    if job.spec.timeslice_group is not None:
        return {"name": CLAIM_NAME, "resourceClaimName": shared_claim_name(job.spec.timeslice_group, index)}
    return {"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(job.name, role)}


def dedicated(job: ElasticRLJob, role: Role | None) -> bool:
    """Whether ``role``'s workers run on dedicated GPUs (the trainer with ``placement: Dedicated``)."""
    return role == "trainer" and job.spec.roles is not None and job.spec.roles.trainer.placement == "Dedicated"


def lent_roles(job: ElasticRLJob) -> tuple[Role | None, ...]:
    """The roles whose workers run on lent GPUs (each has a claim template): (None,) without roles."""
    if job.spec.roles is None:
        return (None,)
    return tuple(r for r in ("trainer", "rollout") if not dedicated(job, r))


def _annotations(job: ElasticRLJob, state_bytes: int | None, role: Role | None = None) -> dict[str, str]:
    s = job.spec
    out = {
        names.ANNOTATION_GRACE: str(s.graceful_shutdown_period),
        extender_names.ANNOTATION_MIN_RUN: str(s.min_useful_run_seconds),
        extender_names.ANNOTATION_GPUS: str(s.role_gpus_per_worker(role)),
    }
    size = state_bytes if state_bytes is not None else s.role_state_bytes(role)
    if size is not None:
        out[names.ANNOTATION_STATE_BYTES] = str(size)
    return out


def _role_env(job: ElasticRLJob, index: int, role: Role | None) -> list[dict[str, Any]]:
    """``ROSE_ROLE``, ``ROSE_ROLE_INDEX``, ``ROSE_TRAINER_ADDR``, ``ROSE_POD_IP`` and the role's size."""
    if role is None or job.spec.roles is None:
        return []
    env: list[dict[str, Any]] = [
        {"name": ENV_ROLE, "value": role},
        {"name": ENV_ROLE_INDEX, "value": str(index)},
        {"name": ENV_TRAINER_ADDR, "value": trainer_addr(job)},
        # the address a trainer's rollout service binds (reachable from the rollout pods)
        {"name": "ROSE_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    r = job.spec.roles
    lo, hi = (
        (r.trainer.workers, r.trainer.workers) if role == "trainer" else (r.rollout.min_workers, r.rollout.max_workers)
    )
    return [*env, {"name": "ROSE_MIN_WORKERS", "value": str(lo)}, {"name": "ROSE_MAX_WORKERS", "value": str(hi)}]


def worker_bounds(job: ElasticRLJob, share: float = 0.0) -> tuple[int, int]:
    """(least, most) workers of a job without roles: ``minGPUs``/``maxGPUs`` over ``gpusPerWorker``,
    or for a job of GPU shares (``share``: each worker's fraction of a GPU, as planned) the workers
    whose shares reach ``minGPUs`` and those that fit ``maxGPUs`` (as the planner counts them)."""
    if share <= 0:
        return job.spec.min_workers, job.spec.max_workers
    lo, hi = job.spec.min_gpus or 0, job.spec.max_gpus or 0
    return math.ceil(round(lo / share, 9)), math.floor(round(hi / share, 9))


def _env(job: ElasticRLJob, index: int, role: Role | None = None, share: float = 0.0) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    env: list[dict[str, Any]] = [
        {"name": "ROSE_POD_UID", "valueFrom": field("metadata.uid")},
        {"name": "ROSE_POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "ROSE_POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "ROSE_JOB_NAME", "value": job.name},
        {"name": "ROSE_WORKER_INDEX", "value": str(index)},
    ]
    if role is None:
        lo, hi = worker_bounds(job, share)
        env += [{"name": "ROSE_MIN_WORKERS", "value": str(lo)}, {"name": "ROSE_MAX_WORKERS", "value": str(hi)}]
    env += _role_env(job, index, role)
    if job.spec.checkpoint_path is not None:
        env.append({"name": "ROSE_CHECKPOINT_PATH", "value": job.spec.checkpoint_path})
        # A recreated worker (its node lost, or evicted by the driver's checkpoint fallback)
        # continues from the job's durable checkpoint; a first start finds none and begins afresh.
        env.append({"name": RESTORE_ENV, "value": RESTORE_LATEST})
    if job.spec.timeslice_group is not None:  # the time-slice client's job name (rose_sdk.timeslice)
        env.append({"name": names.ENV_TIMESLICE_JOB, "value": f"{job.namespace}/{job.name}"})
        env.append({"name": names.ENV_TIMESLICE_TOKEN_FILE, "value": f"{names.TIMESLICE_TOKEN_DIR}/token"})
    return env


TIMESLICE_TOKEN_VOLUME = "rose-timeslice-token"


def timeslice_token_volume() -> dict[str, Any]:
    """The projected ServiceAccount token the orchestrator authenticates a time-sliced worker by."""
    token = {"audience": names.TIMESLICE_TOKEN_AUDIENCE, "expirationSeconds": 3600, "path": "token"}
    return {"name": TIMESLICE_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _container(
    c: dict[str, Any], env: list[dict[str, Any]], timesliced: bool = False, claim: bool = True
) -> dict[str, Any]:
    ours = {e["name"] for e in env}
    c["env"] = [e for e in c.get("env", []) if e.get("name") not in ours] + env
    if timesliced:
        mounts = [m for m in c.get("volumeMounts", []) if m.get("name") != TIMESLICE_TOKEN_VOLUME]
        c["volumeMounts"] = [
            *mounts,
            {"name": TIMESLICE_TOKEN_VOLUME, "mountPath": names.TIMESLICE_TOKEN_DIR, "readOnly": True},
        ]
    if not claim:
        return c
    resources = c.setdefault("resources", {})
    claims = [x for x in resources.get("claims", []) if x.get("name") != CLAIM_NAME]
    resources["claims"] = [*claims, {"name": CLAIM_NAME}]
    return c


def is_control_key(key: str) -> bool:
    """Whether a label or annotation key is ROSE's (``rose.io/...`` or ``<sub>.rose.io/...``): its
    control state, which only ROSE's components write (manifests/policies/control-annotations.yaml)."""
    prefix, sep, _ = key.partition("/")
    return bool(sep) and (prefix == names.LABEL_PREFIX or prefix.endswith("." + names.LABEL_PREFIX))


def _tenant_keys(m: Any) -> dict[str, Any]:
    """The template's labels or annotations without ROSE's control keys: a template must not forge
    a suspend request, a suspend state, a fencing token or a time-slice group on the workers."""
    return {k: v for k, v in (m or {}).items() if not is_control_key(str(k))}


def worker_pod(
    job: ElasticRLJob,
    index: int,
    pool: str | None = None,
    state_bytes: int | None = None,
    role: Role | None = None,
    share: float = 0.0,
) -> dict[str, Any]:
    """Worker ``index`` of the job (of its ``role``, for a job with roles), from its template; ``pool``
    pins it to the pool the planner chose. The template's ``rose.io/`` labels and annotations are
    dropped (the controller writes its own) and so is ``spec.nodeName`` (the scheduler places
    workers; the admission policy refuses it). A dedicated trainer keeps its template's scheduler
    and GPUs (no lendable claim); trainer workers get ``hostname``/``subdomain`` for their Service.
    ``share``: a job of GPU shares, each worker's planned fraction of a GPU (its worker bounds)."""
    template = copy.deepcopy(job.spec.role_template(role))
    meta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    spec.pop("nodeName", None)
    if not spec.get("containers"):
        where = "spec.template" if role is None else f"spec.roles.{role}.template"
        raise ValueError(
            f"ElasticRLJob {job.namespace}/{job.name}: {where}.spec.containers is empty; "
            "give the worker Pod template at least one container"
        )
    env = _env(job, index, role, share)
    timesliced = job.spec.timeslice_group is not None
    lent = not dedicated(job, role)
    spec["containers"] = [_container(c, env, timesliced, lent) for c in spec["containers"]]
    if timesliced:
        volumes = [v for v in spec.get("volumes", []) if v.get("name") != TIMESLICE_TOKEN_VOLUME]
        spec["volumes"] = [*volumes, timeslice_token_volume()]
    if lent:
        spec["schedulerName"] = names.SCHEDULER_NAME
        claims = [c for c in spec.get("resourceClaims", []) if c.get("name") != CLAIM_NAME]
        spec["resourceClaims"] = [*claims, _pod_claim(job, index, role)]
    spec.setdefault("restartPolicy", "Never")
    if pool is not None and not timesliced:
        # a group member's worker is not pinned to the planner's pool: the group's shared claim,
        # once allocated, holds it to its node; a pin to another pool than the claim's left the
        # member unschedulable for good (found by the soak, issue 25 §2)
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), names.LABEL_POOL: pool}
    name = worker_name(job.name, index, role)
    if role == "trainer":
        spec["hostname"], spec["subdomain"] = name, trainer_service_name(job.name)
    labels = {
        **_tenant_keys(meta.get("labels")),
        names.LABEL_JOB: job.name,
        names.LABEL_ROLE: ROLE_RL_WORKER,
        LABEL_WORKER_INDEX: str(index),
    }
    if role is not None:
        labels[LABEL_RL_ROLE] = role
    if job.spec.timeslice_group is not None:  # the time-slice hand-over finds the group's workers by it
        labels[names.LABEL_TIMESLICE_GROUP] = job.spec.timeslice_group
    metadata = {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "annotations": {**_tenant_keys(meta.get("annotations")), **_annotations(job, state_bytes, role)},
        "ownerReferences": [owner_reference(job)],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
