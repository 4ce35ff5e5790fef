"""Demo act 5's arithmetic: the group duty cycle, the switch split, the node it runs on."""

from __future__ import annotations

import pytest

from rose_cli.demo_timeslice import duty_cycle, percentile, pick_node, summary, switch_split, union_s


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


def test_switch_split_counts_only_grants_that_moved_state() -> None:
    moved = [
        {"was_resident": False, "suspend_s": 0.1 * i, "restore_s": 0.2, "grant_overhead_s": 0.01} for i in range(1, 21)
    ]
    resident = {"was_resident": True, "suspend_s": 9.0, "restore_s": 9.0, "grant_overhead_s": 9.0}
    split = switch_split([{"grants": [*moved[:10], resident]}, {"grants": moved[10:]}])
    assert split["suspend"] == (pytest.approx(1.0), pytest.approx(1.9))
    assert split["restore"] == (pytest.approx(0.2), pytest.approx(0.2))
    assert switch_split([{"grants": [resident]}])["grant_overhead"] == (0.0, 0.0)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_pick_node_avoids_act_3_and_act_4s_nodes() -> None:
    pools = {"n0": "pool-a", "n1": "pool-b", "n2": "pool-a", "n3": "pool-b"}
    assert pick_node(["n0", "n1", "n2", "n3"], pools) == "n2"
    assert pick_node(["n0", "n1"], {"n0": "pool-a", "n1": "pool-b"}) == "n1"


def test_shared_duty_cycle_counts_only_while_both_jobs_run() -> None:
    a = {"job": "a", "start": 0.0, "end": 4.0, "phases": [(0, 1), (2, 3)]}
    b = {"job": "b", "start": 0.0, "end": 10.0, "phases": [(1, 2), (3, 4), (6, 7), (8, 9)]}
    assert duty_cycle([a, b]) == pytest.approx(0.6)  # b's solo tail counted
    assert duty_cycle([a, b], overlap=True) == pytest.approx(1.0)
