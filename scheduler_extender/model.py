"""Plain data the policy decides on: per-node and per-pool state, pods, forecasts.

The cache (``cache.py``) derives these from watched Kubernetes objects; the policy
(``policy.py``) is a set of pure functions of them. Nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class PodKind(enum.StrEnum):
    RL = "rl-worker"
    SERVING = "serving"
    OTHER = "other"


POD_KINDS: tuple[PodKind, ...] = tuple(PodKind)


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """One GPU share a pod's claim asks for (DeviceClass ``share.gpu.rose.io``), rounded up to
    the driver's request policy as the scheduler rounds it (memory in GiB steps, compute in 5 %)."""

    memory_bytes: int
    compute_percent: int


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the extender knows about one pod."""

    namespace: str
    name: str
    uid: str
    kind: PodKind
    job: str = ""  # ElasticRLJob name for RL workers
    gpus: int = 1  # GPUs the pod needs (RL workers: lendable GPUs)
    state_bytes: int = 0  # device state that suspend moves to host memory
    grace_s: float = 30.0  # seconds the workload may take to reach a safe point
    at_safe_point: bool = False
    min_run_s: float | None = None  # minimum useful uninterrupted run (RL workers)
    node: str = ""  # spec.nodeName, "" while pending
    priority: int = 0
    suspend_requested: bool = False
    terminating: bool = False
    # GPU shares its claims request (empty: the pod claims whole lendable GPUs, ``gpus``)
    shares: tuple[ShareRequest, ...] = ()
    # every lent claim it uses is allocated already (a time-slice group's shared claim): it asks for
    # no new device, so rose_common.lending's rule for a new claim does not apply to it
    claims_allocated: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeState:
    """A GPU node as published by the ROSE DRA driver (ResourceSlices) and its pods."""

    name: str
    pool: str  # rose.io/gpu-pool label; "" when unlabelled
    gpus: int  # physical GPUs published by gpu.rose.io on this node
    serving_used: int  # physical GPUs whose serving device is allocated
    lent: int  # physical GPUs whose lendable device is allocated
    lendable_free: int  # lendable devices free whose serving twin is free too
    host_mem_free: int | None  # bytes free for suspended state, DRAM + disk tiers; None = not published
    reclaim_cost_s: float  # estimated seconds to take back every lent GPU on the node
    jobs: frozenset[str] = frozenset()  # ElasticRLJobs with a worker on the node
    # GPU shares (the driver's gpu-N-share devices; all empty/0 without --gpu-shares)
    shared_gpus: int = 0  # physical GPUs with at least one share allocated
    share_lent: float = 0.0  # the fraction of a GPU their shares use, summed over those GPUs
    # per GPU that can take a share (not serving-held, not lent whole): (free memory bytes, free compute %)
    share_room: tuple[tuple[int, int], ...] = ()
    gpu_memory: int = 0  # the smallest share device's memory on the node (bytes), 0 without shares


@dataclass(frozen=True, slots=True)
class PoolState:
    capacity: int  # physical GPUs in the pool
    serving_used: int
    lent: int  # GPUs lent whole
    shared_gpus: int = 0  # GPUs lent in shares (each counts whole for a pod claiming whole GPUs)
    share_lent: float = 0.0  # the fraction of a GPU those shares use, summed (what a share counts)
    gpu_memory: int = 0  # the smallest share device's memory in the pool (bytes), 0 without shares


@dataclass(frozen=True, slots=True)
class PoolForecast:
    """A pool's serving-demand forecast reduced to what the policy needs."""

    pool: str
    # (horizon seconds, serving GPUs needed), sorted by horizon: the upper quantile at the horizon,
    # or with basis "risk R" the bound over the whole window [now, now + horizon] at risk R
    points: tuple[tuple[int, float], ...]
    stale: bool = False
    basis: str = "quantile"
    # the reply's generated_at (epoch s): horizons count from it (rose_common.lending); None: from now
    generated_at: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """The cluster as one scheduling call sees it, with per-node precomputed indexes.

    Immutable and self-consistent: ``group_of`` indexes exactly ``groups``, and no map changes
    after the snapshot was taken (the cache copies a map on its first write after handing it
    out), so a call still running on an older snapshot reads the state it started with.
    """

    nodes: Mapping[str, NodeState]
    pools: Mapping[str, PoolState]
    pods: Mapping[str, PodInfo]  # by UID
    job_nodes: Mapping[str, frozenset[str]] = field(default_factory=dict)  # "ns/job" → nodes
    # Nodes grouped by (pool, lendable_free): RL decisions are computed once per group.
    group_of: Mapping[str, int] = field(default_factory=dict)
    groups: Sequence[tuple[str, int]] = ()
    host_mem: Mapping[str, int] = field(default_factory=dict)  # only nodes that publish it
    serving_score: Mapping[str, int] = field(default_factory=dict)
    # RL workers only, by UID (preempt screens victims against it); None: derived from ``pods``
    rl_pods: Mapping[str, PodInfo] | None = None
