"""Names shared across components: API groups, drivers, labels, annotations, device classes."""

from __future__ import annotations

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
# Device attribute names (qualified by the driver's domain when unprefixed)
ATTR_UUID: Final = "uuid"
ATTR_INDEX: Final = "index"
ATTR_MODEL: Final = "model"
ATTR_ROLE: Final = "role"  # "serving" or "lendable"
ATTR_PHYSICAL_GPU: Final = "physicalGPU"
CAPACITY_MEMORY: Final = "memory"
ROLE_SERVING: Final = "serving"
ROLE_LENDABLE: Final = "lendable"

# Labels and annotations
LABEL_PREFIX: Final = "rose.io"
LABEL_JOB: Final = f"{LABEL_PREFIX}/elastic-rl-job"  # set on every ElasticRLJob worker pod
LABEL_ROLE: Final = f"{LABEL_PREFIX}/role"  # "serving" | "rl-worker"
LABEL_POOL: Final = f"{LABEL_PREFIX}/gpu-pool"  # serving pool a node belongs to
LABEL_GPU_NODE: Final = f"{LABEL_PREFIX}/gpu-node"
ANNOTATION_GRACE: Final = f"{LABEL_PREFIX}/graceful-shutdown-seconds"
ANNOTATION_STATE_BYTES: Final = f"{LABEL_PREFIX}/state-bytes"
ANNOTATION_HOST_MEM_FREE: Final = f"{LABEL_PREFIX}/host-memory-free-bytes"
ANNOTATION_LENT: Final = f"{LABEL_PREFIX}/lent-gpus"

# Scheduler
SCHEDULER_NAME: Final = "rose-scheduler"

# Suspend intents through the API server (no extra network endpoint): the extender (or the
# controller) writes ANNOTATION_SUSPEND_REQUEST on an RL worker pod; the DRA driver on that
# pod's node watches for it, suspends the workload into host memory, and reports progress in
# ANNOTATION_SUSPEND_STATE. Value of the request: JSON {"by", "reason", "graceSeconds", "at"}.
ANNOTATION_SUSPEND_REQUEST: Final = f"{LABEL_PREFIX}/suspend-request"
ANNOTATION_SUSPEND_STATE: Final = f"{LABEL_PREFIX}/suspend-state"

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
