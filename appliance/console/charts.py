"""Bar charts drawn on the server: the geometry of an inline SVG (no script, no outside asset)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: int  # the CSS class s<series> colours it
    title: str   # shown on hover and read by screen readers


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    labels: list[tuple[float, str]]  # (x of the group's centre, text) under the axis
    top: float                       # the value of the highest bar
    legend: list[str]
    axis_y: float


def bar_chart(labels: list[str], series: list[tuple[str, list[float]]], *, width: int = 640,
              height: int = 220) -> Chart:
    """Grouped bars: one group per label, one bar per series in each group."""
    axis_y = height - 24
    top = max((v for _, values in series for v in values), default=0) or 1
    group = width / max(len(labels), 1)
    bar_width = max(group * 0.8 / max(len(series), 1), 1)
    bars = []
    for i in range(len(labels)):
        for s, (name, values) in enumerate(series):
            value = values[i]
            h = (axis_y - 8) * max(value, 0) / top
            bars.append(Bar(x=i * group + group * 0.1 + s * bar_width, y=axis_y - h, width=bar_width - 1, height=h,
                            series=s, title=f"{labels[i]}: {value:g} {name}"))
    return Chart(width, height, bars, [(i * group + group / 2, text) for i, text in enumerate(labels)], top,
                 [name for name, _ in series], axis_y)
