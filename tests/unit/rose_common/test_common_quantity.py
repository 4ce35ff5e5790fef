"""rose_common.quantity: apimachinery's resource.Quantity grammar, exactly."""

from __future__ import annotations

from decimal import Decimal

import pytest

from rose_common.quantity import QuantityError, parse_quantity, to_int, to_millis


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", "0"),
        ("60", "60"),
        ("1.5", "1.5"),
        ("1.", "1"),
        (".5", "0.5"),
        ("+2", "2"),
        ("-2", "-2"),
        ("1500m", "1.5"),
        ("250u", "0.00025"),
        ("3n", "0.000000003"),
        ("64k", "64000"),
        ("5M", "5000000"),
        ("2G", "2000000000"),
        ("1T", "1000000000000"),
        ("1P", "1e15"),
        ("1E", "1e18"),
        ("1Ki", "1024"),
        ("1Mi", "1048576"),
        ("1.5Gi", "1610612736"),
        ("1Ti", str(2**40)),
        ("1Pi", str(2**50)),
        ("1Ei", str(2**60)),
        ("5e3", "5000"),
        ("5E3", "5000"),
        ("12e-3", "0.012"),
        ("1e+2", "100"),
    ],
)
def test_valid(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(
    "text",
    ["", " 1", "1 ", "64K", "1KB", "1gi", "1mi", "Gi", "e3", "1e", "1e3.5", "1e19", "--1", "1..2", "0x10", "1 Gi"],
)
def test_invalid(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_error_names_the_text_and_the_allowed_suffixes() -> None:
    with pytest.raises(QuantityError) as e:
        parse_quantity("64K")
    msg = str(e.value)
    assert "'64K'" in msg and "unknown suffix 'K'" in msg and "Ki" in msg and " k " in msg
    with pytest.raises(QuantityError, match=r"not a quantity: 'lots' \(examples: 100m"):
        parse_quantity("lots")


def test_rounding_up_like_value_and_milli_value() -> None:
    assert to_int("1.5Gi") == 1610612736 and to_int("0.1") == 1 and to_int("-0.5") == 0
    assert to_millis("100m") == 100 and to_millis("0.5") == 500 and to_millis("1n") == 1
