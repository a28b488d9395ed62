"""A picture of the Grafana dashboard drawn from what Prometheus answered for its panels:
one small line chart per panel in the dashboard's own grid, as SVG, with no dependency.
e2e/kind_tests/test_dashboard.py writes it when MODELPOOL_DASHBOARD_SVG names a file."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

COLUMN = 24  # Grafana's grid width
CELL_W, CELL_H = 40, 34  # pixels per grid unit
COLORS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9")


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]  # (unix time, value)


@dataclass(frozen=True)
class Panel:
    title: str
    grid: tuple[int, int, int, int]  # x, y, w, h in grid units
    series: Sequence[Series]


def render(title: str, panels: Sequence[Panel], start: float, end: float) -> str:
    height = max((p.grid[1] + p.grid[3] for p in panels), default=1) * CELL_H + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{COLUMN * CELL_W}" '
           f'height="{height}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="#111217"/>',
           f'<text x="10" y="24" fill="#ccccdc" font-size="16">{html.escape(title)}</text>']
    for panel in panels:
        out.append(_panel(panel, start, end))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(panel: Panel, start: float, end: float) -> str:
    gx, gy, gw, gh = panel.grid
    x0, y0 = gx * CELL_W + 4, gy * CELL_H + 40
    w, h = gw * CELL_W - 8, gh * CELL_H - 8
    plot_x, plot_y, plot_w, plot_h = x0 + 40, y0 + 22, w - 50, h - 60
    values = [v for s in panel.series for _, v in s.points if math.isfinite(v)]
    top = max(values, default=1.0) or 1.0
    parts = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="#181b1f" '
             f'stroke="#2c3235"/>',
             f'<text x="{x0 + 8}" y="{y0 + 15}" fill="#ccccdc">{html.escape(panel.title)}</text>',
             f'<text x="{x0 + 4}" y="{plot_y + 8}" fill="#8e8e8e">{top:.3g}</text>',
             f'<text x="{x0 + 4}" y="{plot_y + plot_h}" fill="#8e8e8e">0</text>',
             f'<line x1="{plot_x}" y1="{plot_y + plot_h}" x2="{plot_x + plot_w}" '
             f'y2="{plot_y + plot_h}" stroke="#2c3235"/>']
    span = max(end - start, 1e-9)
    for i, series in enumerate(panel.series[:len(COLORS)]):
        color = COLORS[i % len(COLORS)]
        points = [(plot_x + (t - start) / span * plot_w, plot_y + plot_h - v / top * plot_h)
                  for t, v in series.points if math.isfinite(v)]
        if points:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                         f'stroke-width="1.5"/>')
        parts.append(f'<text x="{x0 + 8 + (i % 3) * (w // 3)}" '
                     f'y="{y0 + h - 22 + (i // 3) * 12}" fill="{color}">'
                     f'{html.escape(series.label[:40])}</text>')
    return "\n".join(parts)
