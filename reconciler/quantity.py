"""Kubernetes quantities ("16Gi", "8G", "1.5Gi", "512Mi", "1e9", 4096) as whole bytes, and
bytes back as a short quantity for messages.

The grammar is the API server's: a number, then a binary suffix (Ki Mi Gi Ti Pi Ei), a
decimal one (n u m k M G T P E) or an exponent (e3, E-2). A fraction of a byte rounds up,
as the API server's `Value()` does. Whatever does not parse raises `QuantityError` naming
the field (pure; `reconciler.spec` turns it into its `SpecError`).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_QUANTITY = re.compile(
    rf"(?P<sign>[+-]?)(?P<number>{_NUMBER})"
    rf"(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exponent>[+-]?{_NUMBER}))?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# The API server keeps a quantity in an int64 once it is a whole number; so do we.
MAX_BYTES = 2**63 - 1


class QuantityError(ValueError):
    """A value is not a quantity, or not one this field takes; the message names the field."""


def parse_quantity(value: Any, field_name: str) -> Decimal:
    """The exact value of a quantity: an integer or a string in the API server's grammar."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise QuantityError(f"{field_name} must be a quantity such as 16Gi or 8G, "
                          f"not {type(value).__name__}")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise QuantityError(f"{field_name} must be a quantity such as 16Gi or 8G, not {value!r}")
    number = Decimal(match["number"])
    if match["sign"] == "-":
        number = -number
    suffix, exponent = match["suffix"], match["exponent"]
    if suffix in _BINARY:
        return number * (1 << (10 * _BINARY[suffix]))
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if exponent is not None:
        scale = Decimal(exponent)
        if scale != scale.to_integral_value():
            raise QuantityError(f"{field_name} must have a whole exponent, not {value!r}")
        # past 10**±100 a number of bytes is too large or a fraction of one anyway
        return number.scaleb(int(max(Decimal(-100), min(Decimal(100), scale))))
    return number


def parse_bytes(value: Any, field_name: str) -> int:
    """Whole bytes of a positive quantity (a fraction of a byte rounds up)."""
    amount = parse_quantity(value, field_name)
    if amount < 0:
        raise QuantityError(f"{field_name} must not be negative, not {value!r}")
    if amount == 0:
        raise QuantityError(f"{field_name} must be positive, not {value!r}")
    if amount > MAX_BYTES:
        raise QuantityError(f"{field_name} is too large: {value!r} is more than 8Ei")
    return math.ceil(amount)


def format_bytes(amount: int) -> str:
    """`amount` as the shortest quantity that states it exactly ("16Gi", "8G", "1500")."""
    candidates = [str(amount)]
    if amount > 0:
        units = [(suffix, 1024**power) for suffix, power in _BINARY.items()]
        units += [(suffix, 10**power) for suffix, power in _DECIMAL.items() if power > 0]
        candidates += [f"{amount // unit}{suffix}" for suffix, unit in units
                       if amount % unit == 0]
    return min(candidates, key=len)
