"""Names shared across components: API groups, drivers, labels, annotations, device classes,
environment variables, suspend states. Pure: no I/O."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Final

# ElasticRLJob custom resource
GROUP: Final = "elastic.rose.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ElasticRLJob"
PLURAL: Final = "elasticrljobs"

# DRA
DRIVER_NAME: Final = "gpu.rose.io"
DEVICE_CLASS_SERVING: Final = "serving.gpu.rose.io"
DEVICE_CLASS_LENDABLE: Final = "lendable.gpu.rose.io"
DEVICE_CLASS_SHARE: Final = "share.gpu.rose.io"  # a fraction of a GPU (consumable capacity; --gpu-shares)
# serving's own fraction of a GPU (--gpu-shares): consumable capacity counted among serving claims only
DEVICE_CLASS_SERVING_SHARE: Final = "serving-share.gpu.rose.io"
# Device attribute names (qualified by the driver's domain when unprefixed)
ATTR_UUID: Final = "uuid"
ATTR_INDEX: Final = "index"
ATTR_MODEL: Final = "model"
ATTR_ROLE: Final = "role"  # "serving", "lendable", "share" or "servingshare"
ATTR_PHYSICAL_GPU: Final = "physicalGPU"
CAPACITY_MEMORY: Final = "memory"
ROLE_SERVING: Final = "serving"
ROLE_LENDABLE: Final = "lendable"
ROLE_SHARE: Final = "share"  # a shareable device (allowMultipleAllocations): an RL share of one GPU
# serving's shareable device (allowMultipleAllocations): a fraction of one GPU for serving; the
# scheduler sums only serving claims on it, the driver reclaims the GPU's RL shares to fit it
ROLE_SERVING_SHARE: Final = "servingshare"
# Roles whose claims are lent: serving wins over them (suspended before serving takes the GPU)
LENT_ROLES: Final = frozenset({ROLE_LENDABLE, ROLE_SHARE})
# Roles whose claims are serving: they reclaim lent occupants (whole GPU, or the fraction they need)
SERVING_ROLES: Final = frozenset({ROLE_SERVING, ROLE_SERVING_SHARE})
# Roles of consumable devices: a claim holds what its allocation consumed (memory, compute)
SHARE_ROLES: Final = frozenset({ROLE_SHARE, ROLE_SERVING_SHARE})
ROLES: Final = (ROLE_SERVING, ROLE_LENDABLE, ROLE_SHARE, ROLE_SERVING_SHARE)
CAPACITY_COMPUTE: Final = "compute"  # a share's percent of the GPU's SMs (MPS active thread percentage)
# CUDA MPS settings a GPU node gives a share's containers (written into the claim's CDI spec)
ENV_MPS_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY: Final = "CUDA_MPS_LOG_DIRECTORY"

# Labels and annotations
LABEL_PREFIX: Final = "rose.io"
LABEL_JOB: Final = f"{LABEL_PREFIX}/elastic-rl-job"  # set on every ElasticRLJob worker pod
LABEL_ROLE: Final = f"{LABEL_PREFIX}/role"  # "serving" | "rl-worker"
LABEL_POOL: Final = f"{LABEL_PREFIX}/gpu-pool"  # serving pool a node belongs to
LABEL_GPU_NODE: Final = f"{LABEL_PREFIX}/gpu-node"
ANNOTATION_GRACE: Final = f"{LABEL_PREFIX}/graceful-shutdown-seconds"
ANNOTATION_STATE_BYTES: Final = f"{LABEL_PREFIX}/state-bytes"
ANNOTATION_HOST_MEM_FREE: Final = f"{LABEL_PREFIX}/host-memory-free-bytes"
# The disk tier of suspended state (the driver's --spill-dir): bytes free under its budget; absent
# without a disk tier. The extender's host-memory filter counts both tiers.
ANNOTATION_SPILL_FREE: Final = f"{LABEL_PREFIX}/host-state-disk-free-bytes"
# GPUs lent whole (a prepared lendable claim): comma-separated indexes
ANNOTATION_LENT: Final = f"{LABEL_PREFIX}/lent-gpus"
# GPUs lent in RL shares: "<index>=<fraction>" comma-separated, the fraction of the GPU its
# prepared shares hold (rose_common.slices.share_fraction of their summed memory and compute)
ANNOTATION_LENT_SHARES: Final = f"{LABEL_PREFIX}/lent-gpu-shares"

# Container environment injected by the DRA driver's per-claim CDI spec (dra_driver/cdi.py) and
# read by the SDK (rose_sdk/workload.py). A container may hold several claims and each claim has
# its own spec, whose env edits all land in the one container; one shared variable would keep
# only the last claim. So every claim injects its own variable: ENV_CLAIM_UID_PREFIX + the UID
# upper-cased with "-" as "_", whose value is the UID itself.
ENV_CLAIM_UID_PREFIX: Final = "ROSE_CLAIM_UID_"
ENV_SIMULATED_GPU: Final = "ROSE_SIMULATED_GPU"  # "1" when the claim's GPUs are simulated
# The job's spec.checkpointPath on its worker pods (the controller sets it); the driver verifies a
# fallback checkpoint only under it.
ENV_CHECKPOINT_PATH: Final = "ROSE_CHECKPOINT_PATH"
_CLAIM_UID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")


def claim_uid_env(claim_uid: str) -> str:
    """``"NAME=VALUE"`` of the variable that tells a container it holds claim ``claim_uid``."""
    if not _CLAIM_UID_RE.match(claim_uid):
        raise ValueError(
            f"claim UID {claim_uid!r} cannot name an environment variable: expected letters, digits and '-'"
        )
    return f"{ENV_CLAIM_UID_PREFIX}{claim_uid.upper().replace('-', '_')}={claim_uid}"


def claim_uids_from_env(env: Mapping[str, str]) -> list[str]:
    """The claim UIDs the driver injected into this container (see :func:`claim_uid_env`), sorted."""
    return sorted({v for k, v in env.items() if k.startswith(ENV_CLAIM_UID_PREFIX) and v})


# Scheduler
SCHEDULER_NAME: Final = "rose-scheduler"

# Suspend intents through the API server (no extra network endpoint): the extender (or the
# controller) writes ANNOTATION_SUSPEND_REQUEST on an RL worker pod; the DRA driver on that
# pod's node watches for it, suspends the workload into host memory, and reports progress in
# ANNOTATION_SUSPEND_STATE. Value of the request: JSON {"by", "reason", "graceSeconds", "at"}.
ANNOTATION_SUSPEND_REQUEST: Final = f"{LABEL_PREFIX}/suspend-request"
ANNOTATION_SUSPEND_STATE: Final = f"{LABEL_PREFIX}/suspend-state"
# The request's "by" when the time-slice orchestrator's hand-over wrote it (timeslice/handover.py):
# the elastic controller counts such a member as still holding its group's shared claim
SUSPEND_BY_TIMESLICE: Final = "timeslice"

# Elastic metadata of an RL worker pod. The controller writes ANNOTATION_WORLD ("active/total":
# the job's active workers and all its workers); the node agent pushes it to the workload. The
# driver writes what the workload reports through the agent (rate-limited): its phase, expected
# seconds to its next safe point, its state bytes and the least it can run with (GPUs per worker,
# host memory bytes); the controller reads them into the status.
ANNOTATION_WORLD: Final = f"{LABEL_PREFIX}/world"
# The controller's nudge to kube-scheduler: a worker pod the scheduler left Unschedulable (an
# extender's verdict is not a cluster event, so nothing else re-queues it) gets this annotation
# set to the time of the nudge; the pod update moves it back to the scheduling queue.
ANNOTATION_SCHEDULE_RETRY: Final = f"{LABEL_PREFIX}/schedule-retry"
ANNOTATION_WORKLOAD_PHASE: Final = f"{LABEL_PREFIX}/workload-phase"
ANNOTATION_SECONDS_TO_SAFE_POINT: Final = f"{LABEL_PREFIX}/seconds-to-safe-point"
ANNOTATION_REPORTED_STATE_BYTES: Final = f"{LABEL_PREFIX}/reported-state-bytes"
ANNOTATION_REPORTED_MIN_GPUS: Final = f"{LABEL_PREFIX}/reported-min-gpus"
ANNOTATION_REPORTED_MIN_HOST_MEMORY: Final = f"{LABEL_PREFIX}/reported-min-host-memory-bytes"


class SuspendState(enum.StrEnum):
    """A lent workload's suspend state: the values of ANNOTATION_SUSPEND_STATE that the driver
    writes on the pod, and the states the node agent's suspend engine keeps per workload."""

    RUNNING = "Running"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    RESUMING = "Resuming"
    CHECKPOINTED_EVICTED = "CheckpointedEvicted"  # state checkpointed durably, pod evicted


# CPU of a suspended RL worker (the DRA driver, dra_driver/resize.py): while the worker's GPU
# state is in host memory the driver lowers its cpu requests through the pods/resize subresource
# and keeps the originals here, JSON {"version": 1, "target": "100m", "containers": {"<name>":
# {"request": "60"[, "limit": "60"]}}[, "skipped": {"<name>": "<reason>"}]}; on resume it writes
# them back and removes the annotation.
ANNOTATION_SUSPENDED_CPU: Final = f"{LABEL_PREFIX}/suspended-cpu"
EVENT_CPU_RELEASED: Final = "CPUReleased"
EVENT_CPU_RESTORED: Final = "CPURestored"
EVENT_CPU_RESIZE_FAILED: Final = "CPUResizeFailed"  # warning
EVENT_CPU_RESIZE_SKIPPED: Final = "CPUResizeSkipped"  # warning

# Time-slicing (timeslice/: jobs that take turns on the same GPUs): the workers of a job in a
# time-slice group carry LABEL_TIMESLICE_GROUP; the orchestrator's hand-over writes
# ANNOTATION_FENCING_TOKEN "<group>:<token>" with every suspend request it writes or clears, and the
# node (driver, agent) refuses a command whose token is older than the last one it saw for that group.
LABEL_TIMESLICE_GROUP: Final = f"{LABEL_PREFIX}/timeslice-group"
ANNOTATION_FENCING_TOKEN: Final = f"{LABEL_PREFIX}/fencing-token"
EVENT_FENCING_REJECTED: Final = "FencingTokenRejected"  # warning

# Serving waits in the scheduler, not in the kubelet's prepare: the driver's ResourceSlices give
# every serving device these binding conditions; the scheduler's DynamicResources plugin holds a
# serving pod in PreBind until the driver reports one of them True in the claim's
# status.devices[].conditions.
BINDING_CONDITION_FREED: Final = "rose.io/device-freed"  # the lent occupant left the GPU
BINDING_CONDITION_FREE_FAILED: Final = "rose.io/device-free-failed"  # it did not: the pod is rescheduled
EVENT_DEVICE_FREEING: Final = "DeviceFreeing"  # on the serving pod: its GPU's occupant is being suspended
EVENT_DEVICE_FREED: Final = "DeviceFreed"
EVENT_DEVICE_NOT_FREED: Final = "DeviceNotFreed"  # warning: the binding failure condition was set
# The planner's intent as device taints: DeviceTaintRules on a pool's lendable devices while serving
# is forecast to need them, so no new lendable claim is allocated there
TAINT_RECLAIM_PLANNED: Final = "rose.io/reclaim-planned"
LABEL_TAINT_POOL: Final = "rose.io/reclaim-taint-pool"  # on the DeviceTaintRules the controller owns
# The driver's own taint on a GPU's lendable device while serving holds that GPU on the node (a
# serving claim prepared, or allocated and being bound): NoSchedule, in the driver's ResourceSlice
TAINT_SERVING_HOLDS: Final = "rose.io/serving-holds"
# GPU shares: a GPU is lent either whole or in shares, never both. While shares are prepared on a
# GPU its lendable device carries TAINT_SHARES_HOLD; while a whole lendable claim is prepared its
# share device carries TAINT_LENT_WHOLE (both NoSchedule, value: the GPU index)
TAINT_SHARES_HOLD: Final = "rose.io/shares-hold"
TAINT_LENT_WHOLE: Final = "rose.io/lent-whole"
# While serving's fractions (gpu-N-servingshare) are prepared on a GPU, its whole serving device
# carries this NoSchedule taint: serving's whole device and serving's fractions never share a GPU
TAINT_SERVING_FRACTIONS: Final = "rose.io/serving-fractions"
ENV_TIMESLICE_JOB: Final = "ROSE_TIMESLICE_JOB"  # "namespace/name": the job name the SDK's client sends
# The orchestrator (--authenticate tokenreview) takes the caller's identity from a projected
# ServiceAccount token of this audience, mounted into time-sliced workers by the controller.
TIMESLICE_TOKEN_AUDIENCE: Final = "rose-timeslice"
ENV_TIMESLICE_TOKEN_FILE: Final = "ROSE_TIMESLICE_TOKEN_FILE"
TIMESLICE_TOKEN_DIR: Final = "/var/run/secrets/rose.io/timeslice"


def fencing_token(group: str, token: int) -> str:
    """The value of ANNOTATION_FENCING_TOKEN for ``token`` of ``group``."""
    return f"{group}:{token}"


def parse_fencing_token(raw: str) -> tuple[str, int]:
    """``(group, token)`` of an ANNOTATION_FENCING_TOKEN value; ValueError says what is wrong."""
    group, sep, num = raw.rpartition(":")
    if not sep or not group or not num.isdigit():
        raise ValueError(f"{ANNOTATION_FENCING_TOKEN} must be '<group>:<token>' with a decimal token, got {raw!r}")
    return group, int(num)
