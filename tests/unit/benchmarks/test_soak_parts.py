"""The soak's pure parts (benchmarks/soak.py): the trace → busy serving GPUs, the seeded fault
plan, and the invariants' judgements."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.soak import (
    FAULT_KINDS,
    Params,
    busiest_node,
    busy_gpus,
    devices_allocated_twice,
    evictions_losing_state,
    fault_plan,
    job_converged,
    prepare_error_summary,
    tally_driver_log,
)


def test_busy_gpus_sizes_one_gpu_from_the_history_peak_and_carries_gaps() -> None:
    # history peak 90 on a 4-GPU pool at 90 %: one GPU serves 25
    v = np.array([10.0, 90.0, 45.0, np.nan, 51.0, 200.0])
    out = busy_gpus(v, history_rows=3, pool_gpus=4)
    assert out.tolist() == [1.0, 4.0, 2.0, 2.0, 3.0, 8.0]  # a gap carries 45; 200 is over the pool
    assert busy_gpus(np.array([0.0, 25.0]), 2, 4).tolist() == [0.0, 4.0]  # the peak itself: 90 % of 4, rounded up


def test_fault_plan_is_seeded_spaced_and_draws_every_kind_before_repeating() -> None:
    nodes = ["n0", "n1"]
    a = fault_plan(7, 900.0, 16, nodes)
    assert a == fault_plan(7, 900.0, 16, nodes) and a != fault_plan(8, 900.0, 16, nodes)
    assert len(a) == 16
    assert {f.kind for f in a[: len(FAULT_KINDS)]} == set(FAULT_KINDS)
    times = [f.at_s for f in a]
    assert times == sorted(times) and all(b - x >= 40.0 - 0.11 for x, b in itertools.pairwise(times))
    assert times[0] >= 30.0 and times[-1] <= 900.0 - 30.0
    assert all(f.target in nodes for f in a if f.kind.startswith("kill-driver"))
    assert all(f.target == "" for f in a if not f.kind.startswith("kill-driver"))
    # a short run holds only what fits between the first 30 s and the last 30 s, 40 s apart
    assert len(fault_plan(1, 150.0, 5, nodes)) == 3
    assert fault_plan(1, 50.0, 5, nodes) == []


def _claim(name: str, *devices: str) -> dict[str, Any]:
    results = [{"pool": "rose-node-0", "device": d} for d in devices]
    return {
        "metadata": {"namespace": "soak", "name": name},
        "status": {"allocation": {"devices": {"results": results}}} if devices else {},
    }


def test_devices_allocated_twice_names_the_device_and_its_claims() -> None:
    ok = [_claim("a", "gpu-0-serving"), _claim("b", "gpu-0-lendable"), _claim("c")]
    assert devices_allocated_twice(ok) == {}
    bad = [*ok, _claim("d", "gpu-0-lendable")]
    assert devices_allocated_twice(bad) == {"rose-node-0/gpu-0-lendable": ["soak/b", "soak/d"]}


def _job(active: int, target: int | None, gen: int = 2, seen: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"generation": gen},
        "spec": {"gpusPerWorker": 1},
        "status": {"observedGeneration": seen, "activeGPUs": active, "targetGPUs": target},
    }


def _w(name: str, state: str = "Running", node: str = "n0") -> dict[str, str]:
    return {"name": name, "state": state, "node": node}


def test_job_converged_says_why_not() -> None:
    assert job_converged(_job(2, 2), [_w("w0"), _w("w1"), _w("w2", "Suspended")]) == ""
    assert job_converged(_job(2, 2, seen=1), [_w("w0"), _w("w1")]) == "status at generation 1, spec at 2"
    assert job_converged(_job(1, 2), [_w("w0")]) == "1 active GPUs, target 2"
    assert job_converged(_job(2, 2), [_w("w0"), _w("w1", "Requested")]) == (
        "1 workers running un-suspended, 2 active GPUs"
    )
    assert job_converged(_job(1, 1), [_w("w0"), _w("w1", "Suspended", "")]) == "workers not bound: w1"


def test_prepare_error_summary_groups_repeats() -> None:
    errs = ["p0: GPU 0 is held by serving claim x; more", "p0: GPU 0 is held by serving claim y", "p1: boom"]
    s = prepare_error_summary(errs)
    assert s["count"] == 3 and s["by_pod"] == {"p0": 2, "p1": 1}
    assert s["top_messages"]["boom"] == 1 and s["last"] == errs


def test_busiest_node_takes_most_then_first_by_name() -> None:
    nodes = ["n1", "n0", "n2"]
    assert busiest_node({"n2": 2, "n1": 1}, nodes) == "n2"
    assert busiest_node({"n2": 1, "n1": 1}, nodes) == "n1"  # a tie: the first by name
    assert busiest_node({}, nodes) == "n0"
    with pytest.raises(ValueError, match="no nodes"):
        busiest_node({}, [])


def test_params_refuse_an_unknown_serving_wait(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="serving_wait 'kubelet': one of prepare, prebind"):
        Params(tmp_path / "s.csv", 1, 96, 0, 1, tmp_path, serving_wait="kubelet")
    assert Params(tmp_path / "s.csv", 1, 96, 0, 1, tmp_path, serving_wait="prebind").serving_wait == "prebind"


def test_evictions_losing_state_are_those_without_a_verified_durable_checkpoint() -> None:
    # the line a driver logged in a soak run (host-memory budget full, a simulated occupant)
    lost = (
        '{"ts": "2026-12-01T22:18:13.267Z", "level": "info", "logger": "rose.driver.kube", "msg": '
        '"evicting lent workload", "pod": "soak/elastic-a-w0", "reason": "cooperative suspend failed '
        '(failed): suspend refused: 68719476736 B of state does not fit the host-memory budget"}'
    )
    kept = (
        '{"msg": "evicting lent workload", "pod": "soak/t-w0", "reason": "suspend refused: ...; fallback: durable '
        'checkpoint /ckpt/t/3.pt (sha256 ab12… verified) written in 0.2s; evicting pod soak/t-w0"}'
    )
    other = '{"msg": "claim prepared", "pod": "soak/x"}'
    out = evictions_losing_state([other, lost, kept, "not json evicting lent workload", ""])
    assert out == [
        "soak/elastic-a-w0: cooperative suspend failed (failed): suspend refused: 68719476736 B of state "
        "does not fit the host-memory budget"
    ]
    assert evictions_losing_state([kept, other]) == []


# the lines a driver logged in the group soak of finding T7 (rose-node-2, checkpoint-dir-full window)
_T7_EVICTION = (
    '{"ts": "2026-12-02T05:27:33.068Z", "level": "info", "logger": "rose.driver.kube", "msg": "evicting lent '
    'workload", "pod": "soak/elastic-a-w1", "reason": "cooperative suspend failed (failed): suspend refused: '
    "68719476736 B of state does not fit the host-memory budget (137438953472 of 137438953472 B held); no "
    "suspended state in DRAM can spill to the disk tier; fallback impossible: the workload has no SDK "
    'checkpoint channel"}'
)
_SPILLED = (
    '{"ts": "2026-12-02T05:20:01.000Z", "level": "info", "logger": "rose.suspend.events", "msg": "event", '
    '"pod": "soak/elastic-a-w0", "reason": "SuspendedStateSpilled", "detail": "suspended state spilled"}'
)
_T7_AT = 1796189253.068  # 2026-12-02T05:27:33.068Z


def test_an_eviction_is_the_faults_only_on_its_node_inside_its_every_tier_full_window() -> None:
    inside = [("rose-node-2", _T7_AT - 10, _T7_AT + 10)]
    t = tally_driver_log([_T7_EVICTION, _SPILLED, _SPILLED, "garbage SuspendedStateSpilled"], "rose-node-2", inside)
    assert (t.lost, t.spills) == ([], 2)
    assert t.by_fault == ["soak/elastic-a-w1: " + str(__import__("json").loads(_T7_EVICTION)["reason"])[:300]]
    # outside the window, on another node, or with no window: the invariant breaks
    for node, windows in (
        ("rose-node-2", [("rose-node-2", _T7_AT + 1, _T7_AT + 10)]),
        ("rose-node-1", inside),
        ("rose-node-2", []),
    ):
        t = tally_driver_log([_T7_EVICTION], node, windows)
        assert len(t.lost) == 1 and t.by_fault == [], (node, windows)


def test_an_eviction_with_a_checkpoint_channel_or_not_for_room_is_never_the_faults() -> None:
    inside = [("n", _T7_AT - 10, _T7_AT + 10)]
    enforced = _T7_EVICTION.replace("does not fit the host-memory budget", "did not free the GPU in time")
    channel = _T7_EVICTION.replace("fallback impossible", "durable checkpoint not confirmed")
    no_ts = _T7_EVICTION.replace('"ts": "2026-12-02T05:27:33.068Z", ', "")
    trainer = _T7_EVICTION.replace("soak/elastic-a-w1", "soak/trainer-w0")  # T4: it has a channel, not yet registered
    for line in (enforced, channel, no_ts, trainer):
        t = tally_driver_log([line], "n", inside)
        assert len(t.lost) == 1 and t.by_fault == [], line


def test_freed_for_serving_reads_the_drivers_node_state() -> None:
    """The prebind check: a serving pod reaches its prepare only once every lent claim on its GPU has
    left it. Suspended, checkpointed and enforced (judged apart as a loss) have; the real trainer's
    refused suspend with its device observed free is T3's corner (the prebind day of 2 Dec failed
    on it while the prepare-mode check counted it); a refused suspend of anyone else, one with device
    memory still resident, a suspend in flight, or no record at all has not."""
    from benchmarks.soak import freed_for_serving
    from dra_driver.state import (
        CHECKPOINTED_EVICTED,
        ENFORCED_EVICTED,
        SUSPEND_FAILED,
        SUSPEND_STARTED,
        SUSPENDED,
    )

    for state in (SUSPENDED, CHECKPOINTED_EVICTED, ENFORCED_EVICTED):
        assert freed_for_serving(state, 0, trainer=False)
    assert freed_for_serving(SUSPEND_FAILED, 0, trainer=True)
    assert not freed_for_serving(SUSPEND_FAILED, 0, trainer=False)
    assert not freed_for_serving(SUSPEND_FAILED, 4096, trainer=True)
    assert not freed_for_serving(SUSPEND_STARTED, 0, trainer=True)
    assert not freed_for_serving(None, 0, trainer=True)
