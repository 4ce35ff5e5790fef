"""Demo act 5's arithmetic: the group duty cycle over the jobs' held intervals."""

from __future__ import annotations

import pytest

from rose_cli.demo_timeslice import duty_cycle, summary, union_s


def test_union_counts_overlaps_once() -> None:
    assert union_s([]) == 0.0
    assert union_s([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == pytest.approx(4.0)


def test_complementary_phases_double_the_duty_cycle() -> None:
    a = {"job": "a", "start": 0.0, "end": 10.0, "phases": [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]}
    b = {"job": "b", "start": 0.0, "end": 10.0, "phases": [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]}
    assert duty_cycle([a]) == pytest.approx(0.5)
    assert duty_cycle([a, b]) == pytest.approx(1.0)
    lines, solo, shared = summary([a, b], [a, b])
    assert (solo, shared) == (pytest.approx(0.5), pytest.approx(1.0))
    assert lines[1].split()[0] == "a" and lines[1].split()[-1] == "50%"
