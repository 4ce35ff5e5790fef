"""A deterministic generator of serving demand shaped like the real traces.

Diurnal cycle (a daytime peak, a night trough, a shoulder in the evening), a weekly cycle
(quieter weekends), multiplicative noise with some persistence (AR(1)), bursts that decay over
tens of minutes, and occasional level shifts (a client arriving or leaving). The same seed
gives the same series on every machine: it is the embedded default for the demo and for
machines without the traces.
"""

from __future__ import annotations

import math

import numpy as np

from predictor.series import Series

DAY = 86400


def generate(
    days: float = 14,
    step: int = 60,
    *,
    seed: int = 7,
    level: float = 40.0,
    start: int = 1_700_006_400,  # a Wednesday, 00:00 UTC
    gap_fraction: float = 0.0,
) -> Series:
    """``days`` of demand at ``step`` seconds around ``level`` (e.g. busy GPUs)."""
    if days <= 0 or step <= 0:
        raise ValueError("days and step must be positive")
    if not 0.0 <= gap_fraction < 1.0:
        raise ValueError("gap_fraction must be in [0, 1)")
    rng = np.random.default_rng(seed)
    n = round(days * DAY / step)
    t = start + step * np.arange(n, dtype=np.int64)
    tod = (t % DAY) / DAY
    dow = ((t // DAY) + 3) % 7  # 1970-01-01 was a Thursday (3 with Monday = 0)
    diurnal = (
        1.0
        + 0.45 * np.sin(2 * math.pi * (tod - 0.35))
        + 0.12 * np.sin(4 * math.pi * (tod - 0.10))
        + 0.05 * np.sin(6 * math.pi * tod)
    )
    weekly = np.where(dow >= 5, 0.72, 1.0) * (1.0 + 0.04 * np.sin(2 * math.pi * dow / 7))
    # level shifts: on average one every 3 days, ±(10..35)%
    shifts = np.ones(n)
    n_shifts = rng.poisson(days / 3)
    for pos in np.sort(rng.integers(0, n, size=n_shifts)):
        shifts[pos:] *= 1.0 + rng.choice([-1.0, 1.0]) * rng.uniform(0.10, 0.35)
    # AR(1) multiplicative noise with a ~20-minute memory
    phi = math.exp(-step / 1200.0)
    eps = rng.normal(0.0, 0.06 * math.sqrt(1 - phi * phi), size=n)
    ar = np.zeros(n)
    for i in range(1, n):
        ar[i] = phi * ar[i - 1] + eps[i]
    # bursts: ~3 a day, +30..120% decaying with a 10..40-minute time constant
    bursts = np.zeros(n)
    for pos in rng.integers(0, n, size=rng.poisson(3 * days)):
        tau = rng.uniform(600, 2400) / step
        amp = rng.uniform(0.3, 1.2)
        k = np.arange(0, min(n - pos, int(6 * tau) + 1))
        bursts[pos : pos + len(k)] += amp * np.exp(-k / tau)
    white = rng.normal(0.0, 0.03, size=n)
    y = level * diurnal * weekly * shifts * np.exp(ar + white) * (1.0 + bursts)
    y = np.clip(y, 0.0, None)
    if gap_fraction > 0:
        # gaps come in runs (a scrape outage), not single points
        n_gap = int(gap_fraction * n)
        while n_gap > 0:
            pos = int(rng.integers(0, n))
            run = min(n_gap, int(rng.integers(1, max(2, 3600 // step))))
            y[pos : pos + run] = np.nan
            n_gap -= run
    return Series(start=int(t[0]), step=step, values=y.astype(np.float64), name=f"generated-{seed}")
