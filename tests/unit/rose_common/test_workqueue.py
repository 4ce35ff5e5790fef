"""rose_common.workqueue: keyed de-duplication, one worker per key, backoff, delayed requeue."""

from __future__ import annotations

import threading
import time

import pytest

from rose_common.workqueue import Backoff, WorkQueue, start_workers


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    assert q.add("a") and q.add("b") and q.add("a")
    assert len(q) == 2
    assert q.get(0) == "a" and q.get(0) == "b" and q.get(0) is None


def test_a_key_added_while_processed_waits_for_done() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")  # changed again while a worker has it: not handed to a second worker
    assert q.get(0) is None
    q.done("a")
    assert q.get(0) == "a"  # ...but not lost either
    q.done("a")
    assert q.idle()


def test_one_worker_per_key_at_a_time_with_many_workers() -> None:
    q: WorkQueue[int] = WorkQueue("t")
    running: dict[int, int] = {}
    overlap: list[int] = []
    seen: list[int] = []
    mu = threading.Lock()

    def work(key: int) -> None:
        with mu:
            running[key] = running.get(key, 0) + 1
            if running[key] > 1:
                overlap.append(key)
            seen.append(key)
        time.sleep(0.005)
        with mu:
            running[key] -= 1

    threads = start_workers(q, work, count=4)
    for _ in range(50):
        for k in range(3):
            q.add(k)
        time.sleep(0.001)
    assert q.wait_idle(10)
    q.shutdown()
    for t in threads:
        t.join(5)
    assert not overlap and set(seen) == {0, 1, 2}
    assert len(seen) < 150  # adds while queued collapsed


def test_requeue_after_and_per_key_backoff() -> None:
    clock = Clock()
    q: WorkQueue[str] = WorkQueue("t", backoff=Backoff(1.0, 4.0), clock=clock)
    assert q.requeue("a", after=2.5) == 2.5
    assert q.waiting("a") and q.get(0) is None
    clock.now += 2.5
    assert q.get(0) == "a" and not q.waiting("a")
    q.done("a")
    assert [q.requeue("b") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]  # doubles, capped
    assert q.failures("b") == 4
    q.forget("b")
    assert q.failures("b") == 0 and q.requeue("b") == 1.0  # success resets the backoff
    assert q.requeue("c", after=0) == 0.0 and q.get(0) == "c"  # "now"


def test_get_wakes_for_a_delayed_key() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.requeue("a", after=0.05)
    t0 = time.monotonic()
    assert q.get(2) == "a"
    assert 0.04 <= time.monotonic() - t0 < 1.5


def test_bounded_and_shutdown() -> None:
    q: WorkQueue[int] = WorkQueue("t", max_len=2)
    assert q.add(1) and q.add(2) and not q.add(3)
    got: list[int | None] = []
    q.get(0), q.get(0)
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(5)
    assert got == [None] and not q.add(4)


def test_a_failing_handler_is_retried_with_backoff_and_the_worker_lives() -> None:
    q: WorkQueue[str] = WorkQueue("t", backoff=Backoff(0.01, 0.02))
    calls: list[str] = []

    def work(key: str) -> None:
        calls.append(key)
        if len(calls) < 3:
            raise RuntimeError("transient")
        q.forget(key)

    start_workers(q, work)
    q.add("a")
    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    q.shutdown()
    assert calls == ["a", "a", "a"] and q.failures("a") == 0


@pytest.mark.parametrize(("initial", "cap"), [(0, 1), (2, 1), (-1, 5)])
def test_bad_backoff_is_refused(initial: float, cap: float) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial, cap)
