"""The node agent's report decisions: world parsing, report checks, counter deltas, rate limit."""

from __future__ import annotations

import pytest

from dra_driver.agent.reports import (
    MAX_PROGRESS_PER_S,
    PHASE_MIN_INTERVAL_S,
    Report,
    ReportBook,
    ReportError,
    World,
    annotations_of,
    due,
    parse_world,
    progress_delta,
    validate,
)
from dra_driver.claims import PodRef
from dra_driver.metrics import DriverMetrics
from rose_common import names


def test_parse_world() -> None:
    assert parse_world("2/4") == World(2, 4)
    assert parse_world(" 0 / 3 ") == World(0, 3)
    for bad in (None, "", "4", "5/4", "0/0", "-1/2", "a/b", "2/4/6"):
        assert parse_world(bad) is None, bad


def test_validate_names_every_bad_field() -> None:
    validate(Report("rollout", 2.0, 10, 1, 0, 3, 4, None))
    with pytest.raises(ReportError) as e:
        validate(Report("has space", float("nan"), -1, 0, 0, -2, 0, -3))
    msg = str(e.value)
    for part in ("phase must be", "seconds_to_safe_point", "state_bytes", "steps", "tokens"):
        assert part in msg


def test_progress_delta_counts_increments_and_restarts() -> None:
    a = Report("train", steps=10, samples=100, tokens=None)
    assert progress_delta(None, a) == (10, 100, 0)
    b = Report("train", steps=15, samples=150, tokens=7)
    assert progress_delta(a, b) == (5, 50, 7)
    restarted = Report("train", steps=2, samples=20, tokens=1)
    assert progress_delta(b, restarted) == (2, 20, 1)


def test_progress_a_workload_reports_is_bounded_by_time() -> None:
    """The counters are the workload's word: 10^18 steps in one report, or a counter that drops to
    0 and climbs back (each drop reads as a restart), adds at most MAX_PROGRESS_PER_S per second."""
    huge = Report("train", steps=10**18, samples=10**18, tokens=10**18)
    steps_s, samples_s, tokens_s = MAX_PROGRESS_PER_S
    assert progress_delta(None, huge, 0.0) == (steps_s, samples_s, tokens_s)  # one second's worth
    assert progress_delta(None, huge, 3.0) == (3 * steps_s, 3 * samples_s, 3 * tokens_s)
    honest = Report("train", steps=50, samples=500, tokens=None)
    assert progress_delta(None, honest, 10.0) == (50, 500, 0)  # a real job is far below the caps

    clock = [0.0]
    m = DriverMetrics([])
    book = ReportBook(m, clock=lambda: clock[0])
    pod = PodRef("ns", "w0", "uid-w0")
    for i in range(10):  # a liar alternating 10^12 and 0, once a second
        clock[0] += 1.0
        book.report(pod, Report("train", steps=10**12 if i % 2 == 0 else 0))
    total = sum(s.value for f in m.rl_steps_total.collect() for s in f.samples if s.name.endswith("_total"))
    assert 0 < total <= 10 * steps_s


def test_due_rate_limits_per_pod_but_lets_a_phase_change_through_sooner() -> None:
    a = annotations_of(Report("train", 3.0))
    b = annotations_of(Report("train", 1.0))
    c = annotations_of(Report("eval", 1.0))
    assert due(None, 0.0, a, 0.0, 10.0)
    assert not due(a, 0.0, a, 100.0, 10.0)  # unchanged: never rewritten
    assert not due(a, 0.0, b, 9.9, 10.0) and due(a, 0.0, b, 10.0, 10.0)
    assert not due(a, 0.0, c, PHASE_MIN_INTERVAL_S / 2, 10.0) and due(a, 0.0, c, PHASE_MIN_INTERVAL_S, 10.0)


def test_book_flush_writes_once_per_interval_and_retries_failures() -> None:
    now = [0.0]
    written: list[dict[str, str]] = []
    fail = [True]

    def publish(ref: PodRef, ann: dict[str, str]) -> None:
        if fail[0]:
            raise OSError("api down")
        written.append(ann)

    book = ReportBook(DriverMetrics([]), publish, min_interval_s=10.0, clock=lambda: now[0])
    pod = PodRef("rl", "w0", "u0")
    book.report(pod, Report("train", 3.0, 100))
    assert book.flush() == 0  # failed: retried on the next tick
    fail[0] = False
    assert book.flush() == 1
    assert written[-1][names.ANNOTATION_REPORTED_STATE_BYTES] == "100"
    book.report(pod, Report("train", 2.0, 100))
    now[0] = 5.0
    assert book.flush() == 0
    now[0] = 10.0
    assert book.flush() == 1 and written[-1][names.ANNOTATION_SECONDS_TO_SAFE_POINT] == "2.0"


def test_observe_pod_versions_world_changes_only() -> None:
    book = ReportBook()

    def pod(world: str) -> dict[str, object]:
        return {
            "metadata": {
                "uid": "u",
                "name": "w",
                "namespace": "rl",
                "labels": {names.LABEL_JOB: "j"},
                "annotations": {names.ANNOTATION_WORLD: world},
            }
        }

    book.observe_pod(pod("2/2"))
    w1, v1 = book.world("u")
    book.observe_pod(pod("2/2"))
    assert book.world("u") == (w1, v1) == (World(2, 2), v1)
    book.observe_pod(pod("1/2"))
    assert book.world("u")[0] == World(1, 2) and book.world("u")[1] != v1
    book.observe_pod({"metadata": {"uid": "x", "name": "serving"}})  # not a job's worker: ignored
    assert book.world("x") == (None, 0)
