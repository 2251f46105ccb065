"""A conversation's requests against the window, as the numbers of an inline SVG (drawn by the
template; no script). Pure.

One bar per request, as high as Ollama counted it, its part read from Ollama's cache shaded
darker; roost's own estimate a dot on each bar; the window and the budget (the window less the
room kept for the answer) as lines across; a fold between two requests as a dashed mark; a
request refused or cut and sent again as a red tick above its bar. Axes: the request number
along, tokens up, each labelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Small enough that the numbers (12 units) stay readable when a phone shrinks the picture to
# its width, and the page's stylesheet caps how far a desktop enlarges it.
WIDTH = 400
HEIGHT = 240
LEFT, RIGHT, TOP, BOTTOM = 62, 10, 14, 42  # room for the axes' numbers and titles
TICKS = 5  # at most this many numbers up the token axis


@dataclass(frozen=True)
class Bar:
    """One request as Ollama counted it, with what roost knew of it."""

    tokens: int
    cached: int | None = None
    estimate: int | None = None
    folds: int | None = None  # the conversation's folds when it was built
    retried: bool = False  # refused as too large or cut silently, then sent again


@dataclass(frozen=True)
class Tick:
    at: float  # x or y in the picture
    label: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    right: float  # the plot's right edge
    top: int
    base: float  # the plot's bottom edge (zero tokens)
    bars: str  # one path: a vertical line a request
    cached: str  # the same for the part from cache
    bar_width: float
    estimates: tuple[tuple[float, float], ...]  # a dot a request roost estimated
    retried: str  # a path of short ticks above the bars of retried requests
    window_y: float
    budget_y: float | None
    folds: tuple[float, ...]  # x of a fold, between the requests on either side
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    window: int
    budget: int | None
    peak: int
    requests: int
    cached_share: float | None  # of every token counted, how much came from cache


def requests_chart(bars: Sequence[Bar], window: int, budget: int | None = None) -> Chart | None:
    """The picture of `bars` against `window` (and `budget`); None with nothing to draw."""
    if not bars or window <= 0:
        return None
    top = _nice_top(max(window, *(b.tokens for b in bars), *(b.estimate or 0 for b in bars)))
    right, base = WIDTH - RIGHT, HEIGHT - BOTTOM
    step = (right - LEFT) / len(bars)

    def x(index: int) -> float:
        return round(LEFT + step * (index + 0.5), 2)

    def y(tokens: float) -> float:
        return round(base - (base - TOP) * tokens / top, 1)

    bar_paths = " ".join(f"M{x(i)} {base}V{y(b.tokens)}" for i, b in enumerate(bars))
    cached = " ".join(f"M{x(i)} {base}V{y(min(b.cached, b.tokens))}"
                      for i, b in enumerate(bars) if b.cached)
    retried = " ".join(f"M{x(i)} {y(b.tokens) - 10}v6" for i, b in enumerate(bars) if b.retried)
    estimates = tuple((x(i), y(b.estimate)) for i, b in enumerate(bars) if b.estimate)
    folds = tuple(round(LEFT + step * i, 2) for i in range(1, len(bars))
                  if None not in (bars[i].folds, bars[i - 1].folds)
                  and (bars[i].folds or 0) > (bars[i - 1].folds or 0))
    counted = sum(b.tokens for b in bars if b.cached is not None)
    share = (sum(b.cached or 0 for b in bars if b.cached is not None) / counted
             if counted else None)
    return Chart(
        WIDTH, HEIGHT, LEFT, right, TOP, base, bar_paths, cached,
        bar_width=round(max(0.6, min(step * 0.7, 14)), 2), estimates=estimates,
        retried=retried, window_y=y(window),
        budget_y=y(budget) if budget and budget < top else None, folds=folds,
        x_ticks=tuple(Tick(x(n - 1), f"{n:,}") for n in _request_numbers(len(bars))),
        y_ticks=tuple(Tick(y(t), f"{t:,}") for t in range(0, top + 1, top // TICKS or 1)
                      if t <= top),
        window=window, budget=budget, peak=max(b.tokens for b in bars), requests=len(bars),
        cached_share=share)


def _nice_top(value: int) -> int:
    """The token axis' top: `value` rounded up to a number of TICKS round steps."""
    raw = max(value, 1) / TICKS
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return math.ceil(step) * TICKS


def _request_numbers(count: int) -> list[int]:
    """Which request numbers the axis names: the first, the last and a few round ones."""
    if count <= 6:
        return list(range(1, count + 1))
    raw = count / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    between = list(range(step, count, step))
    if between and count - between[-1] < step / 2:
        between.pop()  # the last label would crowd the count's own
    return [1, *between, count]
