"""`rose demo` act 4's planner-on / planner-off side by side: one line per run, the measured
prepare and serving wait and the number of suspends, in that order."""

from __future__ import annotations

from rose_cli.demo_elastic import ServingWait, side_by_side


def test_side_by_side_prints_both_runs_with_their_waits_and_suspends() -> None:
    on, off = side_by_side(ServingWait(0.04, 0.006, 0), ServingWait(0.35, 0.338, 1), 5)
    assert on.startswith("planner on : serving prepare  0.04 s,  0.01 s of it waiting for 0 suspend(s)")
    assert off.startswith("planner off: serving prepare  0.35 s,  0.34 s of it waiting for 1 suspend(s)")
    assert "grace period 5 s" in off
