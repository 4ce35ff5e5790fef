"""``rose simulate --gpu-shares N`` (issue 27 §3): the share-lending model on hand-made series,
and the flag through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rose_sim.cli import main as sim_main
from rose_sim.forecasters import Bounds
from rose_sim.shares import planned_shares, share_lending
from tests.support.sim_fixtures import raw_job

TICK = 60


@pytest.mark.parametrize(
    ("bound", "pool", "n", "want"),
    [
        (5.4, 8, 4, (6, 2)),  # 0.6 idle of the 6th GPU: two quarter shares (0.5)
        (5.0, 8, 4, (5, 0)),  # whole GPUs: nothing partly used
        (5.76, 8, 4, (6, 0)),  # 0.24 idle: less than a quarter
        (5.76, 8, 20, (6, 4)),  # ... four 5 % shares
        (7.5, 7, 4, (7, 0)),  # over the pool: no idle fraction
        (0.0, 8, 4, (0, 0)),  # no serving: the GPUs are lent whole, not in shares
    ],
)
def test_planned_shares(bound: float, pool: int, n: int, want: tuple[int, int]) -> None:
    assert planned_shares(bound, pool, n) == want


def _bounds(values: list[float]) -> Bounds:
    return Bounds("test", (600,), np.array(values, dtype=float)[:, None])


def test_share_lending_counts_useful_time_reclaims_and_shrinks() -> None:
    """Quarter shares, 60 s ticks, a start-up of 30 s. Bounds 5.5, 5.75, 5.5, 5.5, 5.75: shares 2, 1,
    2, 2, 1. Serving 5.0, 5.0, 5.8 (over 6 - 0.5: the shares are reclaimed), 5.0, 5.0."""
    r = share_lending(
        np.array([5.0, 5.0, 5.8, 5.0, 5.0]),
        _bounds([5.5, 5.75, 5.5, 5.5, 5.75]),
        history=0,
        tick_s=TICK,
        pool_gpus=8,
        shares_per_gpu=4,
        window_s=600,
        start_s=30.0,
    )
    lent_s = (2 + 1 + 2 + 2 + 1) * TICK / 4
    # tick 0: 2 new (30 s each); 1: 1 kept (planned shrink); 2: reclaimed; 3: 2 new; 4: 1 kept (shrink)
    useful_s = (2 * 30 + 60 + 0 + 2 * 30 + 60) / 4
    assert r.lent_gpu_hours == pytest.approx(lent_s / 3600)
    assert r.useful_gpu_hours == pytest.approx(useful_s / 3600)
    assert (r.unplanned_reclaims, r.planned_shrinks) == (1, 2)
    report = r.report()
    assert report["window_s"] == 600 and report["shares_per_gpu"] == 4


def test_share_lending_skips_the_history_and_refuses_bad_n() -> None:
    busy, b = np.array([5.0] * 4), _bounds([5.5] * 4)
    r = share_lending(busy, b, history=2, tick_s=TICK, pool_gpus=8, shares_per_gpu=4, window_s=600, start_s=0.0)
    assert r.lent_gpu_hours == pytest.approx(2 * 2 * TICK / 4 / 3600)
    with pytest.raises(ValueError, match=r"--gpu-shares must be 1\.\.20"):
        share_lending(busy, b, history=0, tick_s=TICK, pool_gpus=8, shares_per_gpu=21, window_s=600, start_s=0.0)


def _job(tmp_path: Path) -> Path:
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "a.yaml").write_text(
        yaml.safe_dump(
            raw_job("a", 1, 4, stateBytesPerWorker=2**30)  # 1 GiB of state per worker
        )
    )
    return d


def test_cli_gpu_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    t = np.arange(2 * 144)
    values = np.clip(20 + 8 * np.sin(2 * np.pi * t / 144) + rng.normal(0, 1, len(t)), 0, None)
    series = tmp_path / "s.csv"
    series.write_text("t_seconds,value\n" + "".join(f"{i * 600},{v}\n" for i, v in enumerate(values)))
    out = tmp_path / "r.json"
    argv = ["--series", str(series), "--jobs", str(_job(tmp_path)), "--history", "1d", "--pool-gpus", "16",
            "--forecasters", "oracle", "--gpu-shares", "4", "--json", str(out)]  # fmt: skip
    assert sim_main(argv) == 0
    shares = json.loads(out.read_text())["gpu_shares"]
    assert list(shares) == ["oracle"] and shares["oracle"]["shares_per_gpu"] == 4
    assert shares["oracle"]["lent_gpu_hours_per_day"] > 0  # a fractional demand leaves idle fractions
    assert "GPU shares of 1/4 GPU" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sim_main([*argv[:-4], "--gpu-shares", "21"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "21 shares per GPU: use 1..20" in err
