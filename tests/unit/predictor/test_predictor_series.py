"""CSV loading and validation: every bad input gets an error naming the row or the problem."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from predictor.backtest import backtest
from predictor.cli import main
from predictor.model import NotEnoughHistory
from predictor.series import (
    SeriesError,
    format_duration,
    parse_duration,
    parse_durations,
    read_series_csv,
    regularize,
)


def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.csv"
    p.write_text(text)
    return p


def test_durations() -> None:
    assert parse_duration("10m") == 600
    assert parse_duration("1h") == 3600
    assert parse_duration("90") == 90
    assert parse_durations("60m,10m,30m,1h") == [600, 1800, 3600]
    assert format_duration(1800) == "30m"
    assert format_duration(3600) == "1h"
    assert format_duration(90) == "90s"
    for bad in ("", "ten", "-5m", "0s", "1.5s"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


def test_reads_seconds_with_gaps_and_missing_rows(tmp_path: Path) -> None:
    p = _csv(tmp_path, "t,v,extra\n0,1.5,x\n60,,y\n120,3\n240,5\n")
    s = read_series_csv(p)
    assert s.step == 60
    assert s.start == 0
    assert len(s) == 5
    assert s.values[0] == 1.5
    assert math.isnan(s.values[1])  # an empty value is a gap, not a zero
    assert math.isnan(s.values[3])  # a missing timestamp is a gap too
    assert s.values[4] == 5


def test_reads_iso_times(tmp_path: Path) -> None:
    p = _csv(tmp_path, "minute,requests\n2023-11-16 18:17:00,63\n2023-11-16 18:18:00,0\n2023-11-16T18:19:00Z,7\n")
    s = read_series_csv(p)
    assert s.step == 60
    assert s.values.tolist() == [63.0, 0.0, 7.0]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("t,v\n0,1\n120,2\n60,3\n", r"row 4: time '60' is before the previous row's"),
        ("t,v\n0,1\n60,2\n60,3\n", r"row 4: duplicate timestamp '60'"),
        ("t,v\n0,1\n60,abc\n", r"row 3: value 'abc' is not a number"),
        ("t,v\n0,\n60,\n120,\n", r"every value is a gap"),
        ("t,v\nyesterday,1\n", r"row 2: time 'yesterday' is neither seconds nor ISO-8601"),
        ("", r"the file is empty"),
        ("t,v\n", r"no data rows"),
        ("t,v\n0,inf\n", r"row 2: value 'inf' is infinite"),
    ],
)
def test_bad_csv_names_the_problem(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(SeriesError, match=match):
        read_series_csv(_csv(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SeriesError, match="cannot read"):
        read_series_csv(tmp_path / "nope.csv")


def test_history_too_short_for_the_horizon(tmp_path: Path) -> None:
    rows = "\n".join(f"{i * 600},{10 + i % 3}" for i in range(40))
    s = read_series_csv(_csv(tmp_path, "t,v\n" + rows + "\n"))
    with pytest.raises(NotEnoughHistory, match=r"history too short for horizon 1h"):
        backtest(s, [600, 3600], 0.9)


def test_horizon_not_a_multiple_of_the_step() -> None:
    s = regularize(np.arange(0, 6000, 600, dtype=np.float64), np.ones(10))
    with pytest.raises(ValueError, match="not multiples of the series step"):
        backtest(s, [900], 0.9)


def test_cli_backtest_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _csv(tmp_path, "t,v\n0,1\n60,2\n60,3\n")
    rc = main(["backtest", "--series", str(p), "--json", str(tmp_path / "o.json")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "row 4: duplicate timestamp" in err
    assert not (tmp_path / "o.json").exists()


def test_regularize_averages_points_within_a_step() -> None:
    s = regularize(np.array([0.0, 60.0, 90.0, 120.0]), np.array([1.0, 2.0, 4.0, 5.0]), step=60)
    assert s.values.tolist() == [1.0, 3.0, 5.0]
