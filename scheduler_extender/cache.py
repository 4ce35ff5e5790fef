"""The extender's own cluster cache (nodeCacheCapable): nodes, pods, ResourceClaims, ResourceSlices.

Fed with watch events as plain JSON dicts (``kube.py`` does the watching); derives one
:class:`NodeState` per node, recomputed only for nodes an event touched, so a scheduling call
reads precomputed state and costs O(nodes) with small constants. No I/O here.

Every :class:`Snapshot` is immutable and self-consistent: the maps it holds are never written
again. The cache writes copy-on-write: the first write after a snapshot took a map copies that
map (one C-level dict copy), so a call still running on an older snapshot (e.g. one past
kube-scheduler's timeout) keeps reading the state it started with.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from rose_common import names
from rose_common.kube.objects import meta as _meta
from rose_common.kube.objects import spec as _spec
from rose_common.slices import SHARE_COMPUTE_TOTAL
from scheduler_extender import policy, shares
from scheduler_extender.model import NodeState, PodInfo, PodKind, PoolState, ShareRequest, Snapshot

KINDS = ("Node", "Pod", "ResourceClaim", "ResourceSlice")


@dataclass(frozen=True, slots=True)
class _Node:
    pool: str
    host_mem_free: int | None


@dataclass(frozen=True, slots=True)
class _Slice:
    node: str
    pool: str
    generation: int
    # device name → (role, physical GPU id)
    devices: tuple[tuple[str, str, str], ...]
    # shareable devices (--gpu-shares): (device name, physical GPU id, memory capacity bytes)
    share_devices: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class _Shares:
    shared: frozenset[str]  # physical GPUs with a share allocated
    lent: float  # the fraction of a GPU their shares use, summed
    room: tuple[tuple[int, int], ...]  # per GPU that can take a share: (free memory, free compute %)
    memory: int  # the smallest share device's memory (0: none)


def _share_memory(dev: Mapping[str, Any]) -> int:
    cap = (dev.get("capacity") or {}).get(names.CAPACITY_MEMORY) or {}
    try:
        return int(cap.get("value", 0)) if isinstance(cap, Mapping) else 0
    except (TypeError, ValueError):
        return 0


def _attr_str(attrs: Mapping[str, Any], key: str) -> str:
    for name in (key, f"{names.DRIVER_NAME}/{key}"):
        value = attrs.get(name)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


class ClusterCache:
    """Thread-safe: watch threads call :meth:`apply`, request threads call :meth:`snapshot`."""

    def __init__(self, cfg: policy.PolicyConfig | None = None) -> None:
        self._cfg = cfg or policy.PolicyConfig()
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._slices: dict[str, _Slice] = {}
        self._node_slices: dict[str, set[str]] = defaultdict(set)
        self._pool_nodes: dict[str, set[str]] = defaultdict(set)  # DRA pool → node names
        self._claims: dict[str, tuple[tuple[str, str], ...]] = {}  # ns/name → ((pool, device),...)
        self._allocated: dict[tuple[str, str], int] = defaultdict(int)
        # GPU shares: what the claims allocated on each share device consumed, summed (memory, compute)
        self._consumed: dict[tuple[str, str], tuple[int, int]] = {}
        self._claim_consumed: dict[str, tuple[tuple[str, str, int, int], ...]] = {}
        self._share_claims: dict[str, tuple[ShareRequest, ...]] = {}  # ns/name → shares it requests
        self._pool_shares: dict[str, list[float]] = {}  # pool → [shared GPUs, fraction lent in shares]
        self._pool_memory: dict[str, dict[int, int]] = {}  # pool → share device memory → nodes
        self._pods: dict[str, PodInfo] = {}
        self._rl_pods: dict[str, PodInfo] = {}  # the RL workers among _pods
        self._requests: dict[str, str] = {}  # RL worker UID → its rose.io/suspend-request value
        self._node_pods: dict[str, set[str]] = defaultdict(set)
        self._states: dict[str, NodeState] = {}
        # incremental indexes behind Snapshot
        self._pool_acc: dict[str, list[int]] = {}
        self._job_nodes: dict[str, set[str]] = {}
        self._group_index: dict[tuple[str, int], int] = {}
        self._groups: list[tuple[str, int]] = []
        self._group_of: dict[str, int] = {}
        self._host_mem: dict[str, int] = {}
        self._serving_score: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._snapshot: Snapshot | None = None
        # copy-on-write: True while a handed-out snapshot holds these very maps
        self._node_maps_shared = False
        self._pod_maps_shared = False
        self._synced: set[str] = set()

    # ----------------------------------------------------------------------------- sync state
    def mark_synced(self, kind: str) -> None:
        with self._lock:
            self._synced.add(kind)

    @property
    def synced(self) -> bool:
        return all(k in self._synced for k in KINDS)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "Node": len(self._nodes),
                "Pod": len(self._pods),
                "ResourceClaim": len(self._claims),
                "ResourceSlice": len(self._slices),
            }

    # ----------------------------------------------------------------------------- events
    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event (``ADDED``/``MODIFIED``/``DELETED``) of a raw JSON object."""
        with self._lock:
            deleted = event == "DELETED"
            if kind == "Node":
                self._apply_node(obj, deleted)
            elif kind == "Pod":
                self._apply_pod(obj, deleted)
            elif kind == "ResourceClaim":
                self._apply_claim(obj, deleted)
            elif kind == "ResourceSlice":
                self._apply_slice(obj, deleted)
            else:
                raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
            self._snapshot = None

    def replace(self, kind: str, objs: list[Mapping[str, Any]]) -> None:
        """A fresh LIST: drop what is gone, apply what is there."""
        with self._lock:
            keep: set[str] = set()
            for obj in objs:
                meta = _meta(obj)
                keep.add(str(meta.get("uid") if kind == "Pod" else self._key(kind, meta)))
            if kind == "Node":
                gone = [n for n in self._nodes if n not in keep]
                for n in gone:
                    self._apply_node({"metadata": {"name": n}}, True)
            elif kind == "Pod":
                for uid in [u for u in self._pods if u not in keep]:
                    self._drop_pod(uid)
            elif kind == "ResourceClaim":
                for key in [k for k in {*self._claims, *self._share_claims} if k not in keep]:
                    ns, _, name = key.partition("/")
                    self._apply_claim({"metadata": {"namespace": ns, "name": name}}, True)
            elif kind == "ResourceSlice":
                for key in [k for k in self._slices if k not in keep]:
                    self._apply_slice({"metadata": {"name": key}}, True)
        for obj in objs:
            self.apply(kind, "ADDED", obj)

    @staticmethod
    def _key(kind: str, meta: Mapping[str, Any]) -> str:
        if kind == "ResourceClaim":
            return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return str(meta.get("name", ""))

    def _apply_node(self, obj: Mapping[str, Any], deleted: bool) -> None:
        meta = _meta(obj)
        name = str(meta.get("name", ""))
        if deleted:
            self._nodes.pop(name, None)
        else:
            labels = meta.get("labels") or {}
            annotations = meta.get("annotations") or {}
            mem = policy.host_state_free(
                annotations.get(names.ANNOTATION_HOST_MEM_FREE), annotations.get(names.ANNOTATION_SPILL_FREE)
            )
            self._nodes[name] = _Node(pool=str(labels.get(names.LABEL_POOL, "")), host_mem_free=mem)
        self._dirty.add(name)

    def _apply_slice(self, obj: Mapping[str, Any], deleted: bool) -> None:
        name = str(_meta(obj).get("name", ""))
        old = self._slices.pop(name, None)
        if old is not None:
            self._node_slices[old.node].discard(name)
            self._dirty.add(old.node)
            if not any(s.pool == old.pool for s in self._slices.values() if s.node == old.node):
                self._pool_nodes[old.pool].discard(old.node)
        if deleted:
            return
        spec = _spec(obj)
        if spec.get("driver") != names.DRIVER_NAME or not spec.get("nodeName"):
            return
        node = str(spec["nodeName"])
        pool_obj = spec.get("pool") or {}
        devices: list[tuple[str, str, str]] = []
        share_devices: list[tuple[str, str, int]] = []
        for dev in spec.get("devices") or []:
            if not isinstance(dev, Mapping):
                continue
            attrs = dev.get("attributes") or {}
            role = _attr_str(attrs, names.ATTR_ROLE)
            phys = _attr_str(attrs, names.ATTR_PHYSICAL_GPU)
            if role in (names.ROLE_SERVING, names.ROLE_LENDABLE) and phys:
                devices.append((str(dev.get("name", "")), role, phys))
            elif role == names.ROLE_SHARE and phys:
                share_devices.append((str(dev.get("name", "")), phys, _share_memory(dev)))
        sl = _Slice(
            node=node,
            pool=str(pool_obj.get("name", node)),
            generation=int(pool_obj.get("generation", 0) or 0),
            devices=tuple(devices),
            share_devices=tuple(share_devices),
        )
        self._slices[name] = sl
        self._node_slices[node].add(name)
        self._pool_nodes[sl.pool].add(node)
        self._dirty.add(node)

    def _claim_nodes(self, results: tuple[tuple[str, str], ...]) -> set[str]:
        out: set[str] = set()
        for pool, _ in results:
            out |= self._pool_nodes.get(pool, set())
        return out

    def _apply_claim(self, obj: Mapping[str, Any], deleted: bool) -> None:
        meta = _meta(obj)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        old = self._claims.pop(key, None)
        self._share_claims.pop(key, None)
        if old is not None:
            for dev in old:
                self._allocated[dev] -= 1
                if self._allocated[dev] <= 0:
                    del self._allocated[dev]
            self._dirty |= self._claim_nodes(old)
        for pool, device, mem, comp in self._claim_consumed.pop(key, ()):
            m, c = self._consumed.pop((pool, device), (0, 0))
            if (m - mem, c - comp) != (0, 0):
                self._consumed[(pool, device)] = (m - mem, c - comp)
        if deleted:
            return
        requested = shares.claim_share_requests(_spec(obj))
        if requested:
            self._share_claims[key] = requested
        status = obj.get("status") or {}
        alloc = (status.get("allocation") or {}).get("devices") or {}
        ours = [
            r for r in alloc.get("results") or [] if isinstance(r, Mapping) and r.get("driver") == names.DRIVER_NAME
        ]
        results = tuple((str(r.get("pool", "")), str(r.get("device", ""))) for r in ours)
        if not results:
            return
        self._claims[key] = results
        for dev in results:
            self._allocated[dev] += 1
        used = tuple((pool, dev, *shares.consumed(r)) for (pool, dev), r in zip(results, ours, strict=True))
        used = tuple(u for u in used if u[2] or u[3])
        if used:
            self._claim_consumed[key] = used
            for pool, device, mem, comp in used:
                m, c = self._consumed.get((pool, device), (0, 0))
                self._consumed[(pool, device)] = (m + mem, c + comp)
        self._dirty |= self._claim_nodes(results)

    def _own_pod_maps(self) -> None:
        """Copy the pod maps before their first write since a snapshot took them."""
        if self._pod_maps_shared:
            self._pods = dict(self._pods)
            self._rl_pods = dict(self._rl_pods)
            self._pod_maps_shared = False

    def _own_node_maps(self) -> None:
        """Copy the per-node index maps before their first write since a snapshot took them."""
        if self._node_maps_shared:
            self._states = dict(self._states)
            self._group_of = dict(self._group_of)
            self._host_mem = dict(self._host_mem)
            self._serving_score = dict(self._serving_score)
            self._node_maps_shared = False

    def _drop_pod(self, uid: str) -> None:
        self._own_pod_maps()
        old = self._pods.pop(uid, None)
        self._rl_pods.pop(uid, None)
        self._requests.pop(uid, None)
        if old is not None and old.node:
            self._node_pods[old.node].discard(uid)
            self._dirty.add(old.node)

    def _apply_pod(self, obj: Mapping[str, Any], deleted: bool) -> None:
        meta = _meta(obj)
        uid = str(meta.get("uid", ""))
        self._drop_pod(uid)
        if deleted or not uid:
            return
        spec = _spec(obj)
        status = obj.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        owners = [
            (str(o.get("kind", "")), str(o.get("name", "")))
            for o in meta.get("ownerReferences") or []
            if isinstance(o, Mapping)
        ]
        info = policy.pod_info(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=uid,
            labels=meta.get("labels"),
            annotations=meta.get("annotations"),
            owners=owners,
            node=spec.get("nodeName"),
            priority=spec.get("priority"),
            termination_grace_s=spec.get("terminationGracePeriodSeconds"),
            claim_count=len(spec.get("resourceClaims") or []),
            terminating=meta.get("deletionTimestamp") is not None,
            cfg=self._cfg,
        )
        self._pods[uid] = info
        if info.kind is PodKind.RL:
            self._rl_pods[uid] = info
            request = (meta.get("annotations") or {}).get(names.ANNOTATION_SUSPEND_REQUEST)
            if isinstance(request, str):
                self._requests[uid] = request
        if info.node:
            self._node_pods[info.node].add(uid)
            self._dirty.add(info.node)

    # ----------------------------------------------------------------------------- derived
    def _node_state(self, name: str) -> NodeState | None:
        node = self._nodes.get(name)
        if node is None:
            return None
        # Highest generation per DRA pool wins (consumers ignore older generations).
        best_gen: dict[str, int] = {}
        slices = [self._slices[s] for s in self._node_slices.get(name, ()) if s in self._slices]
        for sl in slices:
            best_gen[sl.pool] = max(best_gen.get(sl.pool, sl.generation), sl.generation)
        serving: dict[str, bool] = {}
        lendable: dict[str, bool] = {}
        for sl in slices:
            if sl.generation != best_gen[sl.pool]:
                continue
            for dev, role, phys in sl.devices:
                used = (sl.pool, dev) in self._allocated
                target = serving if role == names.ROLE_SERVING else lendable
                target[phys] = target.get(phys, False) or used
        physical = set(serving) | set(lendable)
        share = self._share_state(slices, best_gen, serving, lendable)
        serving_used = sum(1 for used in serving.values() if used)
        lent = sum(1 for used in lendable.values() if used)
        lendable_free = sum(
            1 for p, used in lendable.items() if not used and not serving.get(p, False) and p not in share.shared
        )
        occupants = [self._pods[uid] for uid in self._node_pods.get(name, ()) if self._pods[uid].kind is PodKind.RL]
        jobs = frozenset(f"{p.namespace}/{p.job}" for p in occupants if p.job)
        return NodeState(
            name=name,
            pool=node.pool,
            gpus=len(physical),
            serving_used=serving_used,
            lent=lent,
            lendable_free=lendable_free,
            host_mem_free=node.host_mem_free,
            reclaim_cost_s=policy.reclaim_cost_s(occupants, self._cfg) if lent or share.shared else 0.0,
            jobs=jobs,
            shared_gpus=len(share.shared),
            share_lent=share.lent,
            share_room=share.room,
            gpu_memory=share.memory,
        )

    def _share_state(
        self,
        slices: list[_Slice],
        best_gen: Mapping[str, int],
        serving: Mapping[str, bool],
        lendable: Mapping[str, bool],
    ) -> _Shares:
        """A node's GPU shares from its share devices and what the claims on them consumed."""
        shared: set[str] = set()
        lent = 0.0
        room: list[tuple[int, int]] = []
        memory = 0
        for sl in slices:
            if sl.generation != best_gen[sl.pool]:
                continue
            for dev, phys, cap in sl.share_devices:
                memory = cap if memory == 0 else min(memory, cap)
                mem, comp = self._consumed.get((sl.pool, dev), (0, 0))
                if (sl.pool, dev) in self._allocated:
                    shared.add(phys)
                    lent += shares.used_fraction(mem, comp, cap)
                if serving.get(phys, False) or lendable.get(phys, False):
                    continue  # serving holds it (a share there is reclaimed at once) or it is lent whole
                free = (cap - mem, SHARE_COMPUTE_TOTAL - comp)
                if free[0] > 0 and free[1] > 0:
                    room.append(free)
        return _Shares(frozenset(shared), lent, tuple(sorted(room, reverse=True)), memory)

    def _index(self, name: str, old: NodeState | None, new: NodeState | None) -> None:
        """Move one node's contribution in the incremental indexes from ``old`` to ``new``."""
        if old is not None:
            acc = self._pool_acc[old.pool]
            acc[0] -= old.gpus
            acc[1] -= old.serving_used
            acc[2] -= old.lent
            acc[3] -= 1  # nodes in the pool
            if acc[3] == 0:
                del self._pool_acc[old.pool]
            self._count_shares(old, -1)
            for job in old.jobs:
                members = self._job_nodes.get(job)
                if members is not None:
                    members.discard(name)
                    if not members:
                        del self._job_nodes[job]
        if new is None:
            self._states.pop(name, None)
            self._group_of.pop(name, None)
            self._host_mem.pop(name, None)
            self._serving_score.pop(name, None)
            return
        self._states[name] = new
        acc = self._pool_acc.setdefault(new.pool, [0, 0, 0, 0])
        acc[0] += new.gpus
        acc[1] += new.serving_used
        acc[2] += new.lent
        acc[3] += 1
        self._count_shares(new, 1)
        for job in new.jobs:
            self._job_nodes.setdefault(job, set()).add(name)
        key = (new.pool, new.lendable_free)
        group = self._group_index.get(key)
        if group is None:
            group = self._group_index[key] = len(self._groups)
            self._groups.append(key)
        self._group_of[name] = group
        if new.host_mem_free is None:
            self._host_mem.pop(name, None)
        else:
            self._host_mem[name] = new.host_mem_free
        self._serving_score[name] = policy.serving_score(new, self._cfg)

    def _count_shares(self, node: NodeState, sign: int) -> None:
        """Move a node's share figures in or out of its pool's sums."""
        if node.shared_gpus:
            acc = self._pool_shares.setdefault(node.pool, [0.0, 0.0])
            acc[0] += sign * node.shared_gpus
            acc[1] += sign * node.share_lent
            if acc[0] <= 0:
                del self._pool_shares[node.pool]
        if node.gpu_memory:
            mem = self._pool_memory.setdefault(node.pool, {})
            mem[node.gpu_memory] = mem.get(node.gpu_memory, 0) + sign
            if mem[node.gpu_memory] <= 0:
                del mem[node.gpu_memory]
            if not mem:
                del self._pool_memory[node.pool]

    def _pool_state(self, pool: str, acc: list[int]) -> PoolState:
        shared, lent = self._pool_shares.get(pool, (0.0, 0.0))
        memory = min(self._pool_memory.get(pool) or {0: 0})
        return PoolState(acc[0], acc[1], acc[2], int(shared), round(lent, 9), memory)

    def claims_allocated(self, namespace: str, claims: list[str]) -> bool:
        """Whether the named ResourceClaims (at least one) are all allocated devices of the ROSE driver."""
        with self._lock:
            return bool(claims) and all(f"{namespace}/{name}" in self._claims for name in claims)

    def share_requests(self, namespace: str, claims: list[str]) -> tuple[ShareRequest, ...]:
        """The GPU shares the named ResourceClaims of a pod request (claims not cached yet: none)."""
        with self._lock:
            out: list[ShareRequest] = []
            for name in claims:
                out += self._share_claims.get(f"{namespace}/{name}", ())
            return tuple(out)

    def snapshot(self) -> Snapshot:
        """The current view, immutable. Only nodes touched since the last call are recomputed;
        the per-node and pod maps are handed over as they are and copied on the cache's next
        write to them, the small per-pool and per-job maps are copied now."""
        with self._lock:
            if self._snapshot is not None and not self._dirty:
                return self._snapshot
            if self._dirty:
                self._own_node_maps()
            for name in self._dirty:
                self._index(name, self._states.get(name), self._node_state(name))
            self._dirty.clear()
            # The per-node and pod maps go out as the dicts themselves, read-only by type
            # (``Mapping``) and by the copy-on-write above: a MappingProxyType would make each of
            # the calls' per-node ``.get`` a Python-level method call, 2.6x a dict's (0.34 vs
            # 0.13 ms per 5,000 names, a quarter of a 5,000-name filter).
            self._snapshot = Snapshot(
                nodes=self._states,
                pools=MappingProxyType({p: self._pool_state(p, v) for p, v in self._pool_acc.items()}),
                pods=self._pods,
                rl_pods=self._rl_pods,
                job_nodes=MappingProxyType({j: frozenset(n) for j, n in self._job_nodes.items()}),
                group_of=self._group_of,
                groups=tuple(self._groups),
                host_mem=self._host_mem,
                serving_score=self._serving_score,
            )
            self._node_maps_shared = self._pod_maps_shared = True
            return self._snapshot

    def suspend_requests(self) -> list[tuple[PodInfo, str]]:
        """Each RL worker with a ``rose.io/suspend-request`` annotation, and its value."""
        with self._lock:
            return [(self._pods[uid], raw) for uid, raw in self._requests.items() if uid in self._pods]

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def mark_suspend_requested(self, uid: str) -> None:
        """Remember locally that a suspend request was sent (the watch confirms it later)."""
        with self._lock:
            info = self._pods.get(uid)
            if info is not None and not info.suspend_requested:
                self._own_pod_maps()
                self._pods[uid] = replace(info, suspend_requested=True)
                if uid in self._rl_pods:
                    self._rl_pods[uid] = self._pods[uid]
                self._snapshot = None
