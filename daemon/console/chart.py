"""The sawtooth: a conversation's request sizes over its turns against the window, as the
numbers of an inline SVG (drawn by the template; no script). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 600
HEIGHT = 200
PAD = 4


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    points: str  # the polyline's "x,y x,y ..."
    window_y: float  # where the window's line is drawn
    window: int
    peak: int
    turns: int


def sawtooth(sizes: Sequence[int], window: int) -> Chart | None:
    """None when there is nothing to draw."""
    if not sizes or window <= 0:
        return None
    top = max(window, *sizes)
    usable_w, usable_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    step = usable_w / max(1, len(sizes) - 1)

    def y(value: int) -> float:
        return round(PAD + usable_h * (1 - value / top), 1)

    points = " ".join(f"{round(PAD + i * step, 1)},{y(v)}" for i, v in enumerate(sizes))
    return Chart(WIDTH, HEIGHT, points, y(window), window, max(sizes), len(sizes))
