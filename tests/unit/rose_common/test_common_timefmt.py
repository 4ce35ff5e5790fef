"""rose_common.timefmt: the one RFC 3339 formatter and parser."""

from __future__ import annotations

import datetime as dt

import pytest

from rose_common.timefmt import parse_rfc3339, rfc3339

T = dt.datetime(2026, 12, 2, 1, 2, 3, 456, tzinfo=dt.UTC)


def test_formats_utc_with_z_to_the_second_or_microsecond() -> None:
    assert rfc3339(T) == "2026-12-02T01:02:03Z"
    assert rfc3339(T, micros=True) == "2026-12-02T01:02:03.000456Z"
    plus2 = T.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert rfc3339(plus2) == "2026-12-02T01:02:03Z"  # converted to UTC, not relabelled


def test_naive_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        rfc3339(dt.datetime(2026, 12, 2, 1, 2, 3))
    with pytest.raises(ValueError, match="no time zone"):
        parse_rfc3339("2026-12-02T01:02:03")


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-12-02T01:02:03Z", dt.datetime(2026, 12, 2, 1, 2, 3, tzinfo=dt.UTC)),
        ("2026-12-02t01:02:03z", dt.datetime(2026, 12, 2, 1, 2, 3, tzinfo=dt.UTC)),
        ("2026-12-02T01:02:03.5Z", dt.datetime(2026, 12, 2, 1, 2, 3, 500000, tzinfo=dt.UTC)),
        ("2026-12-02T01:02:03.000456Z", T),
        ("2026-12-02T01:02:03.000456789Z", T),  # nanoseconds: truncated to microseconds
        ("2026-12-02T03:02:03.000456+02:00", T),
        ("2026-12-01T23:32:03-01:30", dt.datetime(2026, 12, 2, 1, 2, 3, tzinfo=dt.UTC)),
    ],
)
def test_parses_z_offsets_and_fractions_to_utc(text: str, want: dt.datetime) -> None:
    got = parse_rfc3339(text)
    assert got == want and got.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize(
    "text", ["", "2026-12-02", "2026-12-02 01:02:03Z", "20261202T010203Z", "2026-12-02T01:02:03.Z", "soon", "1e9"]
)
def test_not_rfc3339_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not RFC 3339"):
        parse_rfc3339(text)


def test_no_such_date_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid date"):
        parse_rfc3339("2026-13-02T01:02:03Z")


def test_round_trip() -> None:
    for micros in (False, True):
        text = rfc3339(T, micros=micros)
        assert rfc3339(parse_rfc3339(text), micros=micros) == text
