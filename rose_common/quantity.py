"""Kubernetes resource quantities (``resource.Quantity``), parsed exactly. Pure: no I/O, no client.

The grammar is apimachinery's::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= [+-] <digits> [ "." [<digits>] ] | [+-] "." <digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>   (an integer exponent)

So ``"64k"`` is 64000 and ``"64K"`` is refused; ``"1Ki"`` is 1024, ``"1500m"`` is 1.5, ``"5e3"``
is 5000. No surrounding whitespace. Exponents are bounded to ±18 (no resource needs more).
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal

__all__ = ["QuantityError", "parse_quantity", "to_int", "to_millis"]

_NUMBER = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?\d+)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_SUFFIXES = "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent such as e3"


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity; the message names it and the allowed suffixes."""


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity as an exact decimal: ``"60"``, ``"1.5"``, ``"1500m"``, ``"2k"``,
    ``"1Ki"``, ``"5e3"``; anything else raises :class:`QuantityError`."""
    if not isinstance(text, str):
        raise QuantityError(f"not a quantity: {text!r}")
    m = _NUMBER.match(text)
    if m is None:
        raise QuantityError(f"not a quantity: {text!r} (examples: 100m, 1.5, 64Gi, 500M, 5e3)")
    value, suffix = Decimal(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    exp = _EXPONENT.match(suffix)
    if exp is not None and abs(int(exp.group(1))) <= 18:
        return value.scaleb(int(exp.group(1)))
    raise QuantityError(f"not a quantity: {text!r} (unknown suffix {suffix!r}; use {_SUFFIXES})")


def to_int(text: str) -> int:
    """The quantity rounded up to a whole number, like apimachinery's ``Value()`` (bytes, counts)."""
    return int(parse_quantity(text).to_integral_value(rounding=ROUND_CEILING))


def to_millis(text: str) -> int:
    """The quantity in thousandths, rounded up like apimachinery's ``MilliValue()`` (CPU)."""
    return int((parse_quantity(text) * 1000).to_integral_value(rounding=ROUND_CEILING))
