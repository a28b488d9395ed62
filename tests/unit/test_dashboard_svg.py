"""The dashboard's picture: well-formed SVG, a panel per grid cell, a line per series."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from e2e.dashboard_svg import Panel, Series, render

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"


def test_each_series_is_a_line_inside_its_panel() -> None:
    panels = [
        Panel("Swaps", (0, 0, 12, 8), [Series("a -> b", [(0.0, 0.0), (5.0, 1.0)]),
                                       Series("b -> a", [(5.0, 0.0), (10.0, 2.0)])]),
        Panel("Held", (12, 0, 12, 8), [Series("nothing yet", [(0.0, float("nan"))])]),
    ]
    root = ET.fromstring(render("modelpool <test>", panels, 0.0, 10.0))
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "modelpool <test>" in texts and "Swaps" in texts and "Held" in texts
    lines = list(root.iter(f"{SVG}polyline"))
    assert len(lines) == 2  # a series with no finite point draws none
    first = [tuple(map(float, p.split(","))) for p in lines[0].attrib["points"].split()]
    assert first[0][0] < first[1][0] and first[0][1] > first[1][1]  # later, and higher
    assert all(4 <= x <= 12 * 40 for x, _ in first)  # inside the left panel
