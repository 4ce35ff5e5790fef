"""Pydantic models of the ElasticRLJob custom resource (elastic.rose.io/v1alpha1).

Pure data: no I/O. The CRD schema in ``manifests/crd/elasticrljob.yaml`` is the source of truth
for the API server; these models mirror it field for field (names, types, defaults, enums and
bounds) and repeat its CEL rules as validators with the same messages, so the controller refuses
what the API server would refuse. ``tests/unit/elastic_controller/test_elasticrljob_model.py`` walks both schemas.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rose_common.quantity import QuantityError, parse_quantity, to_int

SuspendPolicy = Literal["HostMemoryFirst", "CheckpointAndEvict"]
Role = Literal["trainer", "rollout"]
ROLES: Final[tuple[Role, ...]] = ("trainer", "rollout")
TrainerPlacement = Literal["Dedicated", "Lent"]
RolloutReclaim = Literal["Remove", "Suspend"]
Phase = Literal["Pending", "Running", "Scaling", "Suspending", "Suspended", "Resuming", "Failed", "Succeeded"]
ConditionType = Literal["Ready", "Scaling", "Suspended", "Degraded", "Resident", "ServingHoldsGPU"]
ConditionStatus = Literal["True", "False", "Unknown"]

DEVICE_MEMORY_MAX_BYTES: Final = 256 << 30  # the most memory one GPU has (MI325X 256 GiB; H200 141 GB)
MAX_GPUS_PER_WORKER: Final = 64
MAX_STATE_BYTES: Final = MAX_GPUS_PER_WORKER * DEVICE_MEMORY_MAX_BYTES  # 16 TiB: what 64 GPUs hold
# The CRD's CEL rules, message for message (kept equal by the unit test).
MSG_MIN_LE_MAX: Final = "minGPUs must be less than or equal to maxGPUs"
MSG_MULTIPLES: Final = "minGPUs and maxGPUs must be multiples of gpusPerWorker"
MSG_CHECKPOINT: Final = "suspendPolicy CheckpointAndEvict needs checkpointPath"
MSG_STATE_BYTES: Final = (
    "stateBytesPerWorker must be at most gpusPerWorker x 274877906944 bytes, 256 GiB per GPU: "
    "a worker's device state fits its GPUs' memory"
)
MSG_ROLES_EXCLUSIVE: Final = (
    "spec.roles replaces minGPUs, maxGPUs, template and stateBytesPerWorker: give either roles or those fields"
)
MSG_ROLES_OR_SIZE: Final = "a job without spec.roles needs minGPUs, maxGPUs and template"
MSG_ROLES_TIMESLICE: Final = (
    "spec.roles and timesliceGroup do not combine yet: a time-slice group shares one claim per worker index"
)
MSG_ROLLOUT_MIN_LE_MAX: Final = "rollout minWorkers must be less than or equal to maxWorkers"
MSG_SHARE_GPW: Final = "gpuShare gives each worker a fraction of one GPU: gpusPerWorker must be 1"
MSG_SHARE_EXCLUSIVE: Final = "gpuShare does not combine with spec.roles or timesliceGroup yet"
MSG_SHARE_MEMORY: Final = "gpuShare.memory must be a quantity above 0, such as 20Gi"
MSG_SHARE_MEMORY_MAX: Final = "gpuShare.memory must be at most 256Gi, the most memory one GPU has"
DEFAULT_TRAINER_PORT: Final = 50051
MAX_ROLES_NAME: Final = 50  # <name>-rollout-<4 digits> fits a pod name's 63
_DNS_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)


def _check_state_bytes(state_bytes: int | None, gpus_per_worker: int) -> None:
    if state_bytes is not None and state_bytes > gpus_per_worker * DEVICE_MEMORY_MAX_BYTES:
        raise ValueError(MSG_STATE_BYTES)


class GpuShare(_Model):
    """A worker's share of one GPU (issue 27 §3): the capacities its claim against DeviceClass
    ``share.gpu.rose.io`` requests (``memory``, ``compute``: the device's consumable capacities)."""

    memory: str = Field(max_length=32)
    compute: int = Field(ge=1, le=100)

    @model_validator(mode="after")
    def _cel_rules(self) -> GpuShare:
        try:
            value = parse_quantity(self.memory)
        except QuantityError:
            raise ValueError(MSG_SHARE_MEMORY) from None
        if value <= 0:
            raise ValueError(MSG_SHARE_MEMORY)
        if value > DEVICE_MEMORY_MAX_BYTES:
            raise ValueError(MSG_SHARE_MEMORY_MAX)
        return self

    @property
    def memory_bytes(self) -> int:
        """The memory request in bytes (a fraction of a byte rounded up, as Kubernetes does)."""
        return to_int(self.memory)


class TrainerRole(_Model):
    """The trainer: a fixed gang of ``workers`` (state-heavy: model, gradients, optimizer)."""

    workers: int = Field(ge=1, le=4096)
    gpus_per_worker: int = Field(default=1, alias="gpusPerWorker", ge=1, le=MAX_GPUS_PER_WORKER)
    state_bytes_per_worker: int | None = Field(default=None, alias="stateBytesPerWorker", ge=0, le=MAX_STATE_BYTES)
    placement: TrainerPlacement = "Lent"
    port: int = Field(default=DEFAULT_TRAINER_PORT, ge=1, le=65535)
    template: dict[str, Any]

    @model_validator(mode="after")
    def _cel_rules(self) -> TrainerRole:
        _check_state_bytes(self.state_bytes_per_worker, self.gpus_per_worker)
        return self


class RolloutRole(_Model):
    """Rollout workers: elastic between ``minWorkers`` and ``maxWorkers`` on lent GPUs (weights and
    in-flight generations only: the planner reclaims them first)."""

    min_workers: int = Field(default=0, alias="minWorkers", ge=0, le=4096)
    max_workers: int = Field(alias="maxWorkers", ge=1, le=4096)
    gpus_per_worker: int = Field(default=1, alias="gpusPerWorker", ge=1, le=MAX_GPUS_PER_WORKER)
    state_bytes_per_worker: int | None = Field(default=None, alias="stateBytesPerWorker", ge=0, le=MAX_STATE_BYTES)
    reclaim: RolloutReclaim = "Remove"
    template: dict[str, Any]

    @model_validator(mode="after")
    def _cel_rules(self) -> RolloutRole:
        if self.min_workers > self.max_workers:
            raise ValueError(MSG_ROLLOUT_MIN_LE_MAX)
        _check_state_bytes(self.state_bytes_per_worker, self.gpus_per_worker)
        return self


class Roles(_Model):
    trainer: TrainerRole
    rollout: RolloutRole


class ElasticRLJobSpec(_Model):
    min_gpus: int | None = Field(default=None, alias="minGPUs", ge=1)
    max_gpus: int | None = Field(default=None, alias="maxGPUs", ge=1, le=4096)
    gpus_per_worker: int = Field(default=1, alias="gpusPerWorker", ge=1, le=MAX_GPUS_PER_WORKER)
    graceful_shutdown_period: int = Field(default=30, alias="gracefulShutdownPeriod", ge=0, le=3600)
    checkpoint_path: str | None = Field(default=None, alias="checkpointPath", min_length=1, max_length=4096)
    suspend_policy: SuspendPolicy = Field(default="HostMemoryFirst", alias="suspendPolicy")
    timeslice_group: str | None = Field(
        default=None, alias="timesliceGroup", max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )
    priority: int = Field(default=0, ge=0, le=1000)
    min_useful_run_seconds: int = Field(default=600, alias="minUsefulRunSeconds", ge=0, le=86400)
    state_bytes_per_worker: int | None = Field(default=None, alias="stateBytesPerWorker", ge=0, le=MAX_STATE_BYTES)
    template: dict[str, Any] | None = None
    roles: Roles | None = None
    gpu_share: GpuShare | None = Field(default=None, alias="gpuShare")

    @model_validator(mode="after")
    def _cel_rules(self) -> ElasticRLJobSpec:
        lo, hi = self.min_gpus, self.max_gpus
        if self.roles is not None and (
            lo is not None or hi is not None or self.template is not None or self.state_bytes_per_worker is not None
        ):
            raise ValueError(MSG_ROLES_EXCLUSIVE)
        if self.roles is None and (lo is None or hi is None or self.template is None):
            raise ValueError(MSG_ROLES_OR_SIZE)
        if self.roles is not None and self.timeslice_group is not None:
            raise ValueError(MSG_ROLES_TIMESLICE)
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(MSG_MIN_LE_MAX)
        if (lo or 0) % self.gpus_per_worker or (hi or 0) % self.gpus_per_worker:
            raise ValueError(MSG_MULTIPLES)
        if self.suspend_policy == "CheckpointAndEvict" and self.checkpoint_path is None:
            raise ValueError(MSG_CHECKPOINT)
        _check_state_bytes(self.state_bytes_per_worker, self.gpus_per_worker)
        if self.gpu_share is not None and self.gpus_per_worker != 1:
            raise ValueError(MSG_SHARE_GPW)
        if self.gpu_share is not None and (self.roles is not None or self.timeslice_group is not None):
            raise ValueError(MSG_SHARE_EXCLUSIVE)
        return self

    @property
    def min_gpus_total(self) -> int:
        """The job's minimum GPUs: ``minGPUs``, or with roles the trainer's plus the rollouts' minimum."""
        if self.roles is None:
            return self.min_gpus or 0
        t, r = self.roles.trainer, self.roles.rollout
        return t.workers * t.gpus_per_worker + r.min_workers * r.gpus_per_worker

    @property
    def max_gpus_total(self) -> int:
        """The job's maximum GPUs: ``maxGPUs``, or with roles the trainer's plus the rollouts' maximum."""
        if self.roles is None:
            return self.max_gpus or 0
        t, r = self.roles.trainer, self.roles.rollout
        return t.workers * t.gpus_per_worker + r.max_workers * r.gpus_per_worker

    @property
    def min_workers(self) -> int:
        return (self.min_gpus or 0) // self.gpus_per_worker

    @property
    def max_workers(self) -> int:
        return (self.max_gpus or 0) // self.gpus_per_worker

    def role_gpus_per_worker(self, role: Role | None) -> int:
        """GPUs per worker of ``role`` (None: a job without roles)."""
        if role is None or self.roles is None:
            return self.gpus_per_worker
        return self.roles.trainer.gpus_per_worker if role == "trainer" else self.roles.rollout.gpus_per_worker

    def role_state_bytes(self, role: Role | None) -> int | None:
        """``stateBytesPerWorker`` of ``role`` (None: a job without roles)."""
        if role is None or self.roles is None:
            return self.state_bytes_per_worker
        return getattr(self.roles, role).state_bytes_per_worker  # type: ignore[no-any-return]

    def role_template(self, role: Role | None) -> dict[str, Any]:
        """The worker Pod template of ``role`` (None: the job's ``template``)."""
        if role is None or self.roles is None:
            return self.template or {}
        return self.roles.trainer.template if role == "trainer" else self.roles.rollout.template


class Condition(_Model):
    type: ConditionType
    status: ConditionStatus
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = Field(default=None, alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0)


class RoleStatus(_Model):
    desired_workers: int | None = Field(default=None, alias="desiredWorkers", ge=0)
    active_workers: int | None = Field(default=None, alias="activeWorkers", ge=0)
    suspended_workers: int | None = Field(default=None, alias="suspendedWorkers", ge=0)


class RolesStatus(_Model):
    trainer: RoleStatus | None = None
    rollout: RoleStatus | None = None


class ElasticRLJobStatus(_Model):
    phase: Phase | None = None
    active_workers: int | None = Field(default=None, alias="activeWorkers", ge=0)
    suspended_workers: int | None = Field(default=None, alias="suspendedWorkers", ge=0)
    active_gpus: int | None = Field(default=None, alias="activeGPUs", ge=0)
    suspended_gpus: int | None = Field(default=None, alias="suspendedGPUs", ge=0)
    target_gpus: int | None = Field(default=None, alias="targetGPUs", ge=0)
    last_safe_point: datetime | None = Field(default=None, alias="lastSafePoint")
    last_shrink_time: datetime | None = Field(default=None, alias="lastShrinkTime")
    suspend_count: int | None = Field(default=None, alias="suspendCount", ge=0)
    total_suspended_seconds: float | None = Field(default=None, alias="totalSuspendedSeconds", ge=0)
    workload_phase: str | None = Field(
        default=None, alias="workloadPhase", max_length=63, pattern=r"^[A-Za-z][A-Za-z0-9_-]*$"
    )
    seconds_to_safe_point: float | None = Field(default=None, alias="secondsToSafePoint", ge=0)
    state_bytes: int | None = Field(default=None, alias="stateBytes", ge=0)
    min_gpus_per_worker: int | None = Field(default=None, alias="minGPUsPerWorker", ge=0)
    min_host_memory_bytes: int | None = Field(default=None, alias="minHostMemoryBytes", ge=0)
    fencing_token: int | None = Field(default=None, alias="fencingToken", ge=0)
    gpu_share: float | None = Field(default=None, alias="gpuShare", ge=0, le=1)
    active_share_gpus: float | None = Field(default=None, alias="activeShareGPUs", ge=0)
    target_share_gpus: float | None = Field(default=None, alias="targetShareGPUs", ge=0)
    observed_generation: int | None = Field(default=None, alias="observedGeneration", ge=0)
    roles: RolesStatus | None = None
    conditions: list[Condition] | None = None


class ElasticRLJob(BaseModel):
    """A whole object as the API server returns it (metadata kept as a plain mapping)."""

    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    api_version: Literal["elastic.rose.io/v1alpha1"] = Field(default="elastic.rose.io/v1alpha1", alias="apiVersion")
    kind: Literal["ElasticRLJob"] = "ElasticRLJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ElasticRLJobSpec
    status: ElasticRLJobStatus | None = None

    @model_validator(mode="after")
    def _role_names(self) -> ElasticRLJob:
        """A job with roles names a Service and pods ``<name>-rollout-<i>`` after itself: its name must
        be a DNS label of at most 50 characters (the API server allows dots and 253 in a job's name)."""
        name = self.name
        if self.spec.roles is not None and name and not (len(name) <= MAX_ROLES_NAME and _DNS_LABEL.match(name)):
            raise ValueError(
                f"ElasticRLJob {name!r} has spec.roles: its name must be a DNS label of at most {MAX_ROLES_NAME} "
                "characters (lower-case letters, digits and '-', starting with a letter): its trainer Service "
                "and role pods are named after it"
            )
        return self

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", ""))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))

    @property
    def resource_version(self) -> str:
        """The ``metadata.resourceVersion`` this model was read at ("" when unknown)."""
        return str(self.metadata.get("resourceVersion", "") or "")
