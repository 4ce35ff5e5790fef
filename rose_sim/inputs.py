"""What a simulation reads: the serving-demand series, the RL jobs (ElasticRLJob YAML) and the cost model.

I/O boundary: :func:`load_jobs` reads YAML files and :func:`load_demand` a series CSV; everything
else is pure. Every refusal is a :class:`SimInputError` with a one-line message naming the file
and what to fix.

Demand as observed: the series is held at its own resolution (a 10-minute value holds for the
ten 1-minute ticks of its window; nothing is interpolated from a later point), gaps carry the
last observed value (the traces' gaps are collection holes, not silence), and the GPUs one value
needs come from the history before the evaluated period only (``capacity_per_gpu``: the history's
peak uses ``peak_util`` of the pool), so a burst late in the evaluated period changes no earlier
figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import ValidationError

from elastic_controller.observe import PCIE_BYTES_PER_SECOND
from elastic_controller.planner import role_key
from elastic_controller.workers import lent_roles
from predictor.series import FloatArray, SeriesError, parse_duration, read_series_csv
from rose_common.elasticrljob import ElasticRLJob, Role

DAY = 86400
ANNOTATION_STEP_SECONDS = "sim.rose.io/step-seconds"
ANNOTATION_CHECKPOINT_INTERVAL = "sim.rose.io/checkpoint-interval"
ANNOTATION_SAFE_POINT_SECONDS = "sim.rose.io/safe-point-seconds"
ANNOTATION_GPU_PHASE = "sim.rose.io/gpu-phase-seconds"  # time-slice groups: one cycle's time on the GPUs
ANNOTATION_OFF_PHASE = "sim.rose.io/off-phase-seconds"  # and off them (waiting for rollouts, rewards)
DEFAULT_STEP_SECONDS = 20.0  # one training step per 20 s on one worker (the replay's safe-point period)
DEFAULT_CHECKPOINT_INTERVAL_S = 1800  # a durable checkpoint every 30 min
DEFAULT_SAFE_POINT_S = 20.0  # a safe point at every step's end


class SimInputError(ValueError):
    """An input the simulator cannot use; the message is one line and says what to fix."""


@dataclass(frozen=True)
class CostModel:
    """What every transition costs (defaults stated in docs/simulate.md; each is a ``--cost-*`` flag).

    Suspend (per worker): wait for the safe point (at worst ``min(safe-point period, grace)``),
    pin host buffers (``pin_s``), move the state (``state bytes / pcie_bytes_per_s``; the
    controller's own 25 GB/s planning rate). Resume: the state back over PCIe. A new worker: pod
    start. Any change of a job's set of running workers: every running worker of the job stalls
    ``world_change_s`` (rendezvous, communicator rebuild). A durable checkpoint stalls the job
    ``state bytes / storage_bytes_per_s`` every checkpoint interval (all policies pay it); an
    evicted job restarts from its last checkpoint (the work since is lost) and reads it back at
    the same rate. An eviction frees the GPU after ``evict_s`` (the process exits). Throughput
    of ``n`` workers is ``1 + (n - 1) * scaling_efficiency`` workers' worth. A new rollout worker of
    a job with roles computes after pod start + ``weight_pull_s`` (it pulls the policy weights)."""

    pcie_bytes_per_s: float = PCIE_BYTES_PER_SECOND
    pin_s: float = 0.5
    pod_start_s: float = 60.0
    world_change_s: float = 20.0
    storage_bytes_per_s: float = 2e9
    evict_s: float = 10.0
    scaling_efficiency: float = 0.9
    weight_pull_s: float = 30.0  # a new rollout worker (a job with roles) pulls the policy weights

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not math.isfinite(value) or value < 0:
                raise SimInputError(f"cost model: {name} must be a finite number >= 0, got {value}")
        if self.pcie_bytes_per_s <= 0 or self.storage_bytes_per_s <= 0:
            raise SimInputError("cost model: bandwidths must be > 0")
        if self.scaling_efficiency > 1:
            raise SimInputError(f"cost model: scaling_efficiency must be in [0, 1], got {self.scaling_efficiency}")

    def transfer_s(self, state_bytes: int) -> float:
        return state_bytes / self.pcie_bytes_per_s

    def suspend_s(self, state_bytes: int, safe_wait_s: float) -> float:
        """From the request to a free GPU: safe point, pinning, the state out over PCIe."""
        return safe_wait_s + self.pin_s + self.transfer_s(state_bytes)

    def checkpoint_s(self, state_bytes: int) -> float:
        return state_bytes / self.storage_bytes_per_s

    def throughput(self, workers: float) -> float:
        """Workers' worth of progress ``workers`` (fractional: part of a tick) make together."""
        return workers if workers <= 1 else 1 + (workers - 1) * self.scaling_efficiency


@dataclass(frozen=True)
class SimJob:
    """An ElasticRLJob as the user would apply it, plus what the simulation needs of its workload."""

    job: ElasticRLJob
    step_seconds: float = DEFAULT_STEP_SECONDS  # one step's time on one worker
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S
    safe_point_s: float = DEFAULT_SAFE_POINT_S  # period of the workload's safe points
    cycle_s: tuple[float, float] | None = None  # time-slice groups: (seconds on the GPUs, off them) per cycle
    role: Role | None = None  # a job with spec.roles, as the planner sees one of its roles (role_views)

    @property
    def key(self) -> str:
        """``<namespace>/<name>``; a role's view (:func:`role_views`) ``...#<role>``, the planner's key."""
        return role_key(f"{self.job.namespace}/{self.job.name}", self.role)

    @property
    def state_bytes(self) -> int:
        """Per worker (of ``role``): what its suspend moves over PCIe."""
        return self.job.spec.role_state_bytes(self.role) or 0

    @property
    def safe_wait_s(self) -> float:
        """The longest wait for a safe point: the period, never past the grace period (the driver acts then)."""
        return min(self.safe_point_s, float(self.job.spec.graceful_shutdown_period))


def _annotation_seconds(doc: ElasticRLJob, key: str, default: float, where: str) -> float:
    raw = (doc.metadata.get("annotations") or {}).get(key)
    if raw is None:
        return default
    try:
        return float(parse_duration(str(raw)))
    except ValueError as e:
        raise SimInputError(f"{where}: annotation {key}: {e}") from None


def _job(raw: Any, where: str) -> SimJob:
    if not isinstance(raw, dict):
        raise SimInputError(f"{where}: not a YAML mapping (an ElasticRLJob object)")
    if raw.get("kind") != "ElasticRLJob":
        raise SimInputError(f"{where}: kind {raw.get('kind')!r} is not ElasticRLJob")
    try:
        job = ElasticRLJob.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "spec"
        raise SimInputError(f"{where}: {loc}: {err['msg']} (the CRD refuses it)") from None
    meta = dict(job.metadata)
    if not meta.get("name"):
        raise SimInputError(f"{where}: metadata.name is missing")
    meta.setdefault("namespace", "default")
    job = job.model_copy(update={"metadata": meta})
    cycle = None
    if job.spec.timeslice_group is not None:
        ann = job.metadata.get("annotations") or {}
        if ANNOTATION_GPU_PHASE not in ann or ANNOTATION_OFF_PHASE not in ann:
            raise SimInputError(
                f"{where}: timesliceGroup {job.spec.timeslice_group!r}: give its cycle as annotations "
                f"{ANNOTATION_GPU_PHASE} and {ANNOTATION_OFF_PHASE} (seconds on the GPUs and off them)"
            )
        cycle = (
            _annotation_seconds(job, ANNOTATION_GPU_PHASE, 0.0, where),
            _annotation_seconds(job, ANNOTATION_OFF_PHASE, 0.0, where),
        )
    return SimJob(
        job,
        cycle_s=cycle,
        step_seconds=_annotation_seconds(job, ANNOTATION_STEP_SECONDS, DEFAULT_STEP_SECONDS, where),
        checkpoint_interval_s=_annotation_seconds(
            job, ANNOTATION_CHECKPOINT_INTERVAL, DEFAULT_CHECKPOINT_INTERVAL_S, where
        ),
        safe_point_s=_annotation_seconds(job, ANNOTATION_SAFE_POINT_SECONDS, DEFAULT_SAFE_POINT_S, where),
    )


def role_views(j: SimJob) -> list[SimJob]:
    """The simulation's jobs of one ElasticRLJob, as the controller plans it: the job itself, or with
    ``spec.roles`` one view per role on lent GPUs (``workers.lent_roles``: a Dedicated trainer is not
    planned, its GPUs are outside the pool), each keyed ``<key>#<role>`` with the role's state bytes."""
    if j.job.spec.roles is None:
        return [j]
    return [replace(j, role=r) for r in lent_roles(j.job) if r is not None]


def parse_jobs(docs: list[tuple[str, Any]]) -> list[SimJob]:
    """``(where, YAML document)`` pairs → jobs, validated by the CRD's pydantic model (pure)."""
    jobs = [_job(raw, where) for where, raw in docs if raw is not None]
    if not jobs:
        raise SimInputError("no ElasticRLJob found: give a YAML file or a folder of them")
    keys = [j.key for j in jobs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise SimInputError(f"job {dup} is defined twice")
    return sorted(jobs, key=lambda j: j.key)


def load_jobs(path: Path) -> list[SimJob]:
    """Every ElasticRLJob in a YAML file, or in the ``*.yaml`` / ``*.yml`` files of a folder."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if not files:
            raise SimInputError(f"{path}: no *.yaml files in the folder")
    elif path.is_file():
        files = [path]
    else:
        raise SimInputError(f"{path}: no such file or folder")
    docs: list[tuple[str, Any]] = []
    for f in files:
        try:
            loaded = list(yaml.safe_load_all(f.read_text()))
        except yaml.YAMLError as e:
            raise SimInputError(f"{f}: not valid YAML: {str(e).splitlines()[0]}") from None
        docs += [(f"{f}" + (f" (document {i + 1})" if len(loaded) > 1 else ""), d) for i, d in enumerate(loaded)]
    return parse_jobs(docs)


@dataclass(frozen=True)
class Demand:
    """Busy serving GPUs per tick, held at the trace's resolution; ticks ``< history`` are the history."""

    start: int  # epoch seconds of tick 0
    tick_s: int
    busy: FloatArray  # GPUs serving needs during each tick (may exceed the pool: over capacity)
    history: int  # ticks before the evaluated period
    source_step: int
    capacity_per_gpu: float  # demand one GPU serves, from the history only
    observed: FloatArray | None = None  # the demand itself (its unit), held like ``busy``: what the predictor reads

    @property
    def ticks(self) -> int:
        return len(self.busy)

    @property
    def evaluated_days(self) -> float:
        return (self.ticks - self.history) * self.tick_s / DAY


def held(values: FloatArray, source_step: int, tick_s: int) -> FloatArray:
    """The series on the tick grid, each value held over its own window; gaps carry the last value."""
    filled = values.copy()
    first = np.flatnonzero(~np.isnan(filled))
    if len(first) == 0:
        raise SimInputError("the series has no observed value")
    filled[: first[0]] = filled[first[0]]
    for i in range(1, len(filled)):
        if math.isnan(filled[i]):
            filled[i] = filled[i - 1]
    per = source_step // tick_s
    out: FloatArray = np.repeat(filled, per)
    return out


def demand_from_values(
    start: int,
    values: FloatArray,
    source_step: int,
    *,
    tick_s: int,
    history_s: int,
    pool_gpus: int,
    peak_util: float = 0.9,
    capacity_per_gpu: float | None = None,
    min_evaluated_s: int = DAY,
) -> Demand:
    """Busy GPUs per tick (pure). ``capacity_per_gpu`` None: the history's peak uses ``peak_util`` of the pool."""
    if tick_s <= 0 or source_step % tick_s:
        raise SimInputError(f"--tick {tick_s}s must divide the series step ({source_step}s)")
    if history_s < DAY:
        raise SimInputError(f"--history must be at least 1d (the baselines read yesterday), got {history_s}s")
    span = len(values) * source_step
    if span < history_s + min_evaluated_s:
        raise SimInputError(
            f"the series spans {span / 3600:.1f} h; the history ({history_s / 3600:.0f} h) and at least "
            f"{min_evaluated_s / 3600:.0f} h to evaluate need {(history_s + min_evaluated_s) / 3600:.0f} h"
        )
    x = held(values, source_step, tick_s)
    history = history_s // tick_s
    if capacity_per_gpu is None:
        peak = float(np.max(x[:history]))
        if peak <= 0:
            raise SimInputError("the history never exceeds 0: cannot size the pool from it (give --capacity-per-gpu)")
        capacity_per_gpu = peak / (pool_gpus * peak_util)
    if capacity_per_gpu <= 0:
        raise SimInputError(f"--capacity-per-gpu must be > 0, got {capacity_per_gpu}")
    busy: FloatArray = np.ceil(np.clip(x, 0, None) / capacity_per_gpu - 1e-9)
    return Demand(start, tick_s, busy, history, source_step, capacity_per_gpu, np.clip(x, 0, None))


def load_demand(path: Path, **kw: Any) -> Demand:
    """A series CSV in the traces' format (header; time, value) → :func:`demand_from_values`."""
    if path.suffix.lower() != ".csv":
        raise SimInputError(f"{path}: unknown series format {path.suffix or '(none)'!r}: give a CSV (time,value)")
    try:
        s = read_series_csv(path)
    except SeriesError as e:
        raise SimInputError(str(e)) from None
    return demand_from_values(s.start, s.values, s.step, **kw)


def load_pools(path: Path, **kw: Any) -> list[tuple[str, int, Demand]]:
    """``--pools FILE.yaml``: ``pools:`` a list of ``{name, gpus, series}`` (the series' path relative to
    the file) with optional ``capacity_per_gpu``, ``peak_util`` or ``busy_gpus: true``; each pool's
    series through :func:`load_demand` with its own GPUs. The first pool is the primary one."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SimInputError(f"--pools {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SimInputError(f"--pools {path}: not valid YAML: {str(e).splitlines()[0]}") from None
    items = raw.get("pools") if isinstance(raw, dict) else None
    if not isinstance(items, list) or not items:
        raise SimInputError(f"--pools {path}: expected 'pools:' with a list of {{name, gpus, series}}")
    out: list[tuple[str, int, Demand]] = []
    for n, item in enumerate(items):
        name, gpus, d = _load_pool(path, n, item, out, kw)
        out.append((name, gpus, d))
    return out


_POOL_FIELDS = frozenset({"name", "gpus", "series", "capacity_per_gpu", "peak_util", "busy_gpus"})


def _check_pool_item(where: str, item: Any, out: list[tuple[str, int, Demand]]) -> tuple[str, int]:
    """One ``pools:`` entry's name and GPUs, or the one-line error that says what to fix."""
    if not isinstance(item, dict) or not {"name", "gpus", "series"} <= set(item):
        raise SimInputError(f"{where}: needs name, gpus and series")
    extra = set(item) - _POOL_FIELDS
    if extra:
        raise SimInputError(
            f"{where}: unknown field(s) {', '.join(sorted(extra))}; known: {', '.join(sorted(_POOL_FIELDS))}"
        )
    name, gpus = str(item["name"]), item["gpus"]
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 100_000:
        raise SimInputError(f"{where} ({name}): gpus must be a whole number in 1..100000, got {gpus!r}")
    if name in {o[0] for o in out}:
        raise SimInputError(f"{where}: pool {name} is defined twice")
    return name, gpus


def _load_pool(
    path: Path, n: int, item: Any, out: list[tuple[str, int, Demand]], kw: dict[str, Any]
) -> tuple[str, int, Demand]:
    where = f"--pools {path}: pool {n + 1}"
    name, gpus = _check_pool_item(where, item, out)
    cap = 1.0 if item.get("busy_gpus") else item.get("capacity_per_gpu")
    try:
        d = load_demand(
            path.parent / str(item["series"]),
            **{
                **kw,
                "pool_gpus": gpus,
                "peak_util": float(item.get("peak_util", kw.get("peak_util", 0.9))),
                "capacity_per_gpu": None if cap is None else float(cap),
            },
        )
    except SimInputError as e:
        raise SimInputError(f"pool {name}: {e}") from None
    except (TypeError, ValueError) as e:
        raise SimInputError(f"{where} ({name}): {e}") from None
    first = out[0][2] if out else d
    if (d.start, d.tick_s, d.ticks) != (first.start, first.tick_s, first.ticks):
        raise SimInputError(f"{where} ({name}): its series must cover the same times as pool {out[0][0]}'s")
    return name, gpus, d
