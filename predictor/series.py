"""Time series on a fixed step: loading and validating CSV files, durations, regular grids.

A :class:`Series` is the predictor's plain-data view of one metric: ``times`` (epoch seconds,
strictly increasing, evenly spaced by ``step``) and ``values`` (float, ``NaN`` = a gap, never a
zero). Everything else in the package works on it.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class SeriesError(ValueError):
    """The input series cannot be used; the message says which row or what to fix."""


def parse_duration(text: str) -> int:
    """``"30m"`` → 1800. Accepts s, m, h, d, w (or a bare number of seconds); whole seconds only."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"bad duration {text!r}: use a number with a unit, e.g. 10m, 1h, 600s")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2) or "s"]
    if seconds <= 0 or abs(seconds - round(seconds)) > 1e-9:
        raise ValueError(f"bad duration {text!r}: must be a positive whole number of seconds")
    return round(seconds)


def format_duration(seconds: int) -> str:
    """1800 → ``"30m"``; the inverse of :func:`parse_duration` for whole units."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_durations(text: str) -> list[int]:
    """``"10m,30m,60m"`` → [600, 1800, 3600], sorted and de-duplicated."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("no durations given: use a comma-separated list such as 10m,30m,60m")
    return sorted({parse_duration(p) for p in parts})


@dataclass(frozen=True)
class Series:
    """Values on a regular grid: ``times[i] = start + i * step``; NaN marks a gap."""

    start: int
    step: int
    values: FloatArray
    name: str = "series"

    @property
    def times(self) -> IntArray:
        return self.start + self.step * np.arange(len(self.values), dtype=np.int64)

    @property
    def end(self) -> int:
        """Time of the last grid point."""
        return self.start + self.step * (len(self.values) - 1)

    def __len__(self) -> int:
        return len(self.values)

    def observed(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.values)))


def _parse_time(text: str, row: int) -> float:
    t = text.strip()
    if not t:
        raise SeriesError(f"row {row}: empty time; the first column must be seconds or ISO-8601")
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise SeriesError(
            f"row {row}: time {t!r} is neither seconds nor ISO-8601 (e.g. 2023-11-16T18:17:00Z)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _parse_value(text: str, row: int) -> float:
    v = text.strip()
    if not v or v.lower() in {"nan", "na", "null"}:
        return math.nan
    try:
        x = float(v)
    except ValueError:
        raise SeriesError(f"row {row}: value {v!r} is not a number (leave it empty for a gap)") from None
    if math.isinf(x):
        raise SeriesError(f"row {row}: value {v!r} is infinite")
    return x


def infer_step(times: FloatArray) -> int:
    """The grid step: the most common difference between consecutive times, in whole seconds."""
    diffs = np.diff(times)
    if len(diffs) == 0:
        raise SeriesError("the series has a single row: cannot infer its time step")
    rounded = np.round(diffs).astype(np.int64)
    vals, counts = np.unique(rounded, return_counts=True)
    step = int(vals[np.argmax(counts)])
    if step <= 0:
        raise SeriesError("cannot infer a positive time step from the time column")
    return step


def regularize(times: FloatArray, values: FloatArray, step: int | None = None, name: str = "series") -> Series:
    """Put sorted, unique (time, value) pairs on a grid of ``step``; missing grid points are gaps.

    Points between grid times are assigned to the grid point at or before them (a point
    belongs to the step it falls in); two points in one step are averaged.
    """
    if len(times) == 0:
        raise SeriesError("the series is empty")
    st = infer_step(times) if step is None else step
    start = math.floor(float(times[0]))
    idx = np.floor((times - start) / st + 1e-9).astype(np.int64)
    n = int(idx[-1]) + 1
    sums = np.zeros(n)
    counts = np.zeros(n)
    ok = ~np.isnan(values)
    np.add.at(sums, idx[ok], values[ok])
    np.add.at(counts, idx[ok], 1.0)
    out = np.full(n, np.nan)
    nz = counts > 0
    out[nz] = sums[nz] / counts[nz]
    return Series(start=start, step=st, values=out, name=name)


def read_series_csv(path: Path, step: int | None = None) -> Series:
    """Read a CSV with a header: column 1 time (seconds or ISO-8601), column 2 value; the rest ignored.

    Raises :class:`SeriesError` naming the row for unsorted or duplicate times, non-numeric
    values, and for a series that is all gaps. Rows are numbered as in a text editor (the
    header is row 1).
    """
    try:
        fh = path.open(newline="")
    except OSError as e:
        raise SeriesError(f"cannot read {path}: {e.strerror}") from None
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise SeriesError(f"{path}: the file is empty; expected a header row then time,value rows")
        if len(header) < 2:
            raise SeriesError(f"{path}: row 1 (header) has {len(header)} column(s); need time,value")
        times, values = _data_rows(reader, path)
    if not times:
        raise SeriesError(f"{path}: no data rows after the header")
    arr = np.asarray(values, dtype=np.float64)
    if np.all(np.isnan(arr)):
        raise SeriesError(f"{path}: every value is a gap (empty): nothing to learn from")
    if len(times) < 2:
        raise SeriesError(f"{path}: a single data row: need at least two to infer the time step")
    return regularize(np.asarray(times, dtype=np.float64), arr, step=step, name=path.stem)


def _data_rows(reader: Iterator[list[str]], path: Path) -> tuple[list[float], list[float]]:
    """The times and values of the rows after the header (blank rows skipped), strictly increasing
    in time; :class:`SeriesError` names the first row that is not."""
    times: list[float] = []
    values: list[float] = []
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < 2:
            raise SeriesError(f"{path}: row {lineno}: expected at least 2 columns (time,value)")
        t = _parse_time(row[0], lineno)
        v = _parse_value(row[1], lineno)
        if times:
            if t == times[-1]:
                raise SeriesError(f"{path}: row {lineno}: duplicate timestamp {row[0].strip()!r}")
            if t < times[-1]:
                raise SeriesError(
                    f"{path}: row {lineno}: time {row[0].strip()!r} is before the previous row's; sort the file by time"
                )
        times.append(t)
        values.append(v)
    return times, values


def write_series_csv(series: Series, path: Path, header: tuple[str, str] = ("t_seconds", "value")) -> None:
    """Write ``t,value`` rows; a gap is an empty value."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for t, v in zip(series.times.tolist(), series.values.tolist(), strict=True):
            w.writerow([t, "" if math.isnan(v) else repr(round(v, 6))])
