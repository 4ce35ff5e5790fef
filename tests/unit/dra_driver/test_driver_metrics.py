from __future__ import annotations

from prometheus_client import generate_latest

from dra_driver.metrics import DriverMetrics


def test_every_series_starts_at_zero_with_rose_prefix() -> None:
    m = DriverMetrics([0, 1])
    text = generate_latest(m.registry).decode()
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert samples and all(s.startswith("rose_driver_") for s in samples)
    for series in (
        'rose_driver_prepare_total{result="ok"} 0.0',
        'rose_driver_prepare_total{result="error"} 0.0',
        'rose_driver_unprepare_total{result="error"} 0.0',
        'rose_driver_occupant_suspend_total{outcome="timeout"} 0.0',
        'rose_driver_gpu_residency{gpu="1",resident="lent"} 0.0',
        "rose_driver_prepare_duration_seconds_count 0.0",
        "rose_driver_suspended_state_bytes 0.0",
    ):
        assert series in samples, series


def test_residency_is_one_hot() -> None:
    m = DriverMetrics([0])
    m.set_residency(0, "serving")
    got = {r: m.residency.labels("0", r)._value.get() for r in ("none", "serving", "lent")}
    assert got == {"none": 0, "serving": 1, "lent": 0}
