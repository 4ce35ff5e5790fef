"""What each workload reports through the node agent, and the world of its job.

* **Reports** (``WorkloadAgent.Report``): the workload's phase, expected seconds to its next safe
  point, state bytes, minimum resources and RL progress counters (cumulative). The counters'
  increments go to the ``rose_rl_{steps,samples,tokens}_total{namespace,job,pool}`` counters; the
  phase, seconds to safe point and state bytes are written onto the pod as annotations
  (``rose.io/workload-phase``, ``rose.io/seconds-to-safe-point``, ``rose.io/reported-state-bytes``),
  at most once per ``min_interval_s`` per pod (a phase change after ``PHASE_MIN_INTERVAL_S``).
* **World**: the controller writes ``rose.io/world`` = "active/total" on each worker pod; the pod
  watch hands every pod to :meth:`ReportBook.observe_pod`, and the WorkloadAgent servicer pushes a
  ``COMMAND_KIND_WORLD`` to the workload whenever its pod's world changes (and first thing on
  every new command stream).

The decisions (:func:`parse_world`, :func:`validate`, :func:`progress_delta`, :func:`due`) are pure.
I/O boundary: :class:`ReportBook` holds in-memory tables; it writes annotations only through the
``publish`` callable it is given (the driver's ``KubeNotifier.annotate``), from its own thread.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prometheus_client import Counter

from dra_driver.claims import PodRef
from rose_common import names
from rose_common.kube import objects

log = logging.getLogger("rose.agent.reports")

PHASE_MIN_INTERVAL_S: Final = 1.0
MAX_PODS: Final = 1024  # entries kept (least recently touched dropped first): far above a node's pods
_PHASE_RE: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_WORLD_RE: Final = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")

Publish = Callable[[PodRef, dict[str, str]], None]


class RlCounters(Protocol):
    """The driver's ``rose_rl_*`` counters (``dra_driver.metrics.DriverMetrics``)."""

    rl_steps_total: Counter
    rl_samples_total: Counter
    rl_tokens_total: Counter


class ReportError(ValueError):
    """A malformed report; the message names the field and what to fix."""


@dataclass(frozen=True)
class World:
    active: int
    total: int

    def __str__(self) -> str:
        return f"{self.active}/{self.total}"


def parse_world(raw: str | None) -> World | None:
    """``"active/total"`` (0 <= active <= total, total >= 1) or None when absent or malformed."""
    m = _WORLD_RE.match(raw or "")
    if m is None:
        return None
    active, total = int(m.group(1)), int(m.group(2))
    return World(active, total) if 0 <= active <= total and total >= 1 else None


@dataclass(frozen=True)
class Report:
    phase: str
    seconds_to_safe_point: float = 0.0
    state_bytes: int = 0
    min_gpus: int = 0
    min_host_memory_bytes: int = 0
    steps: int = 0
    samples: int = 0
    tokens: int | None = None  # None: the job counts no tokens


def validate(r: Report) -> None:
    """Raises ReportError naming every bad field."""
    problems = []
    if not _PHASE_RE.match(r.phase):
        problems.append(
            f"phase must be a short name (a letter, then letters, digits, '-' or '_'; at most 63), got {r.phase!r}"
        )
    if not math.isfinite(r.seconds_to_safe_point) or not 0 <= r.seconds_to_safe_point <= 86400:
        problems.append(f"seconds_to_safe_point must be between 0 and 86400, got {r.seconds_to_safe_point}")
    for name in ("state_bytes", "min_gpus", "min_host_memory_bytes", "steps", "samples", "tokens"):
        v = getattr(r, name)
        if v is not None and v < 0:
            problems.append(f"{name} must be >= 0, got {v}")
    if problems:
        raise ReportError("invalid report: " + "; ".join(problems))


# The most progress one report may add per second since the pod's previous report (or since the
# book first saw the pod): the counters are the workload's own word (docs/security.md, "Workload
# reports are hints"), so a report of 10^18 steps, or one that drops to 0 and climbs back again and
# again, adds at most this much. Far above any real job: a step is milliseconds at the fastest.
MAX_PROGRESS_PER_S: Final = (10_000, 10_000_000, 10_000_000_000)  # steps, samples, tokens
MIN_PROGRESS_WINDOW_S: Final = 1.0  # a report right after another may still add one second's worth


def progress_delta(old: Report | None, new: Report, elapsed_s: float | None = None) -> tuple[int, int, int]:
    """Increments of (steps, samples, tokens) since ``old``; a counter below its last value means
    the workload restarted, so it counts again from 0. With ``elapsed_s`` (seconds since ``old``, or
    since the pod was first seen), each increment is capped at :data:`MAX_PROGRESS_PER_S` times
    ``max(elapsed_s, MIN_PROGRESS_WINDOW_S)``."""

    def inc(before: int | None, now: int | None, per_s: int) -> int:
        if now is None:
            return 0
        d = now if before is None or now < before else now - before
        return d if elapsed_s is None else min(d, int(per_s * max(elapsed_s, MIN_PROGRESS_WINDOW_S)))

    steps_s, samples_s, tokens_s = MAX_PROGRESS_PER_S
    return (
        inc(old.steps if old else None, new.steps, steps_s),
        inc(old.samples if old else None, new.samples, samples_s),
        inc(old.tokens if old else None, new.tokens, tokens_s),
    )


def annotations_of(r: Report) -> dict[str, str]:
    out = {
        names.ANNOTATION_WORKLOAD_PHASE: r.phase,
        names.ANNOTATION_SECONDS_TO_SAFE_POINT: f"{r.seconds_to_safe_point:.1f}",
    }
    if r.state_bytes > 0:
        out[names.ANNOTATION_REPORTED_STATE_BYTES] = str(r.state_bytes)
    if r.min_gpus > 0:  # 0: not reported
        out[names.ANNOTATION_REPORTED_MIN_GPUS] = str(r.min_gpus)
    if r.min_host_memory_bytes > 0:
        out[names.ANNOTATION_REPORTED_MIN_HOST_MEMORY] = str(r.min_host_memory_bytes)
    return out


def due(
    published: dict[str, str] | None, published_at: float, wanted: dict[str, str], now: float, min_interval_s: float
) -> bool:
    """Whether ``wanted`` should be written now: never written, or changed and the pod's last
    write is ``min_interval_s`` old (``PHASE_MIN_INTERVAL_S`` when the phase changed)."""
    if published is None:
        return True
    if published == wanted:
        return False
    phase_changed = published.get(names.ANNOTATION_WORKLOAD_PHASE) != wanted.get(names.ANNOTATION_WORKLOAD_PHASE)
    return now - published_at >= (PHASE_MIN_INTERVAL_S if phase_changed else min_interval_s)


@dataclass
class _Pod:
    namespace: str = ""
    name: str = ""
    job: str = ""
    pool: str = ""
    world: World | None = None
    world_version: int = 0
    report: Report | None = None
    published: dict[str, str] | None = None
    published_at: float = 0.0
    reported_at: float | None = None  # when the last report came (None: none yet)
    seen_at: float | None = None  # when the book first heard of the pod


def _pool_of(pod: dict[str, Any]) -> str:
    selector = (objects.spec(pod).get("nodeSelector") or {}).get(names.LABEL_POOL)
    return str(selector or objects.labels(pod).get(names.LABEL_POOL) or "")


class ReportBook:
    """Reports and worlds by pod UID (thread-safe); see the module docstring."""

    def __init__(
        self,
        metrics: RlCounters | None = None,
        publish: Publish | None = None,
        *,
        min_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.publish = publish
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, _Pod] = OrderedDict()
        self._versions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _entry(self, uid: str) -> _Pod:
        """The pod's entry, created when missing (lock held)."""
        p = self._pods.get(uid)
        if p is None:
            p = self._pods[uid] = _Pod()
            while len(self._pods) > MAX_PODS:
                self._pods.popitem(last=False)
        self._pods.move_to_end(uid)
        return p

    # ------------------------------------------------------------------ world (pod watch → workload)
    def observe_pod(self, pod: dict[str, Any]) -> None:
        """A pod observer of the driver's pod watch: the job, pool and world of ElasticRLJob workers."""
        job = objects.labels(pod).get(names.LABEL_JOB)
        uid = objects.uid(pod)
        if not job or not uid:
            return
        world = parse_world(objects.annotations(pod).get(names.ANNOTATION_WORLD))
        with self._lock:
            p = self._entry(uid)
            p.namespace, p.name, p.job, p.pool = objects.namespace(pod), objects.name(pod), job, _pool_of(pod)
            if world is not None and world != p.world:
                self._versions += 1
                p.world, p.world_version = world, self._versions
        if world is not None:
            log.debug("world observed", extra={"podUID": uid, "world": str(world)})

    def world(self, pod_uid: str) -> tuple[World | None, int]:
        """The pod's world and its version (changes whenever the world does)."""
        with self._lock:
            p = self._pods.get(pod_uid)
            return (p.world, p.world_version) if p is not None else (None, 0)

    def forget(self, pod_uid: str) -> None:
        with self._lock:
            self._pods.pop(pod_uid, None)

    # ------------------------------------------------------------------ reports (workload → driver)
    def report(self, pod: PodRef, r: Report) -> World | None:
        """Record ``r`` (validated by the caller), count its progress; the pod's world."""
        with self._lock:
            p = self._entry(pod.uid)
            p.namespace, p.name = p.namespace or pod.namespace, p.name or pod.name
            now = self._clock()
            p.seen_at = now if p.seen_at is None else p.seen_at
            since = p.reported_at if p.reported_at is not None else p.seen_at
            steps, samples, tokens = progress_delta(p.report, r, now - since)
            p.report, p.reported_at = r, now
            labels = (p.namespace, p.job, p.pool)
            world = p.world
        m = self.metrics
        if m is not None:
            m.rl_steps_total.labels(*labels).inc(steps)
            m.rl_samples_total.labels(*labels).inc(samples)
            if r.tokens is not None:
                m.rl_tokens_total.labels(*labels).inc(tokens)
        return world

    def latest(self, pod_uid: str) -> Report | None:
        with self._lock:
            p = self._pods.get(pod_uid)
            return p.report if p is not None else None

    def flush(self) -> int:
        """Write the annotations that are due (see :func:`due`); returns how many pods were written."""
        if self.publish is None:
            return 0
        now = self._clock()
        todo: list[tuple[str, PodRef, dict[str, str]]] = []
        with self._lock:
            for uid, p in self._pods.items():
                if p.report is None or not p.name:
                    continue
                wanted = annotations_of(p.report)
                if due(p.published, p.published_at, wanted, now, self.min_interval_s):
                    todo.append((uid, PodRef(p.namespace, p.name, uid), wanted))
        written = 0
        for uid, ref, wanted in todo:
            try:
                self.publish(ref, wanted)
            except Exception as e:  # retried on the next tick; the log says why
                log.warning("report annotations not written", extra={"podUID": uid, "err": repr(e)})
                continue
            written += 1
            with self._lock:
                entry = self._pods.get(uid)
                if entry is not None:
                    entry.published, entry.published_at = wanted, now
        return written

    # ------------------------------------------------------------------ the annotation writer thread
    def start(self, tick_s: float = PHASE_MIN_INTERVAL_S) -> None:
        if self.publish is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(tick_s,), name="rose-agent-reports", daemon=True)
        self._thread.start()

    def _loop(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            self.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
