"""Quantities as bytes: the API server's grammar, binary and decimal suffixes, fractions
rounded up, and refusals that name the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from reconciler.quantity import QuantityError, format_bytes, parse_bytes

pytestmark = pytest.mark.unit

GI = 1024**3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("16Gi", 16 * GI),
        ("8G", 8 * 10**9),
        ("512Mi", 512 * 1024**2),
        ("1.5Gi", 3 * GI // 2),
        ("1Ki", 1024),
        ("2Ti", 2 * 1024**4),
        ("1Ei", 1024**6),
        ("3k", 3000),
        ("4M", 4 * 10**6),
        ("1T", 10**12),
        ("1e9", 10**9),
        ("2E3", 2000),
        ("1.5e+3", 1500),
        ("4096", 4096),
        (4096, 4096),
        ("+1Gi", GI),
        (".5Ki", 512),
        ("1.", 1),
        ("1500m", 2),  # a fraction of a byte rounds up, as the API server's Value() does
        ("1n", 1),
        ("1e-3", 1),
    ],
)
def test_parse_bytes(value: Any, expected: int) -> None:
    assert parse_bytes(value, "spec.gpuMemory") == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1Gi", "must not be negative"),
        (-5, "must not be negative"),
        ("0", "must be positive"),
        (0, "must be positive"),
        ("0Gi", "must be positive"),
        ("16GB", "must be a quantity"),
        ("16 Gi", "must be a quantity"),
        ("16gi", "must be a quantity"),
        ("lots", "must be a quantity"),
        ("", "must be a quantity"),
        ("Gi", "must be a quantity"),
        ("1e1.5", "whole exponent"),
        ("1e400", "too large"),
        ("9Ei", "too large"),
        (1.5, "must be a quantity"),
        (True, "must be a quantity"),
        (None, "must be a quantity"),
    ],
)
def test_parse_bytes_refuses_naming_the_field(value: Any, says: str) -> None:
    with pytest.raises(QuantityError, match=re.escape("spec.gpuMemory") + ".*" + says):
        parse_bytes(value, "spec.gpuMemory")


@pytest.mark.parametrize(
    ("amount", "text"),
    [(16 * GI, "16Gi"), (3 * GI // 2, "1536Mi"), (8 * 10**9, "8G"), (1024, "1Ki"),
     (1500, "1500"), (3000, "3k"), (7, "7")],
)
def test_format_bytes(amount: int, text: str) -> None:
    assert format_bytes(amount) == text
    assert parse_bytes(text, "x") == amount
