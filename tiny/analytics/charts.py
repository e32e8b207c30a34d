"""The dashboard's charts, written as SVG (tiny.analytics.svg) in an analytics pool process.

:func:`render` draws the ``traffic``, ``whales`` and ``hourly`` views from a day's aggregate
(tiny.analytics.answers, small data: 24 hours and N whales), 0-4 ms of CPU each;
:func:`detail_job` draws one ip_id's downloads from its rows (tiny.analytics.rows),
the one view that reads them (its thousands of points one embedded image).

Every chart is WIDTH units wide, a width read at about 1:1 on a 420 px phone and at up to
1.35x beside another chart on a desktop (the page scales it to its column; no text is
smaller than SMALL_TEXT units), and carries what
it is of on its root element (``data-view``, ``data-day``, and ``data-whales`` or
``data-ip-id``): the page shows no chart of a day other than the one selected.
Element ids name what the tests count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiny.aggregate_sql import HOURS
from tiny.analytics.names import whale_name
from tiny.analytics.rows import DayFile, ranked, rows_of
from tiny.analytics.svg import Canvas, Marks, png, text_width, ticks
from tiny.cranlog import Row

if TYPE_CHECKING:
    from tiny.analytics.answers import DayAggregate, Whale

VIEWS = ("traffic", "whales", "hourly", "detail")
FROM_AGGREGATES = ("traffic", "whales", "hourly")  # the others read rows
BARS = 20  # whales drawn as bars, at most: the table beside the chart lists all N
SMALL_MULTIPLES = 6  # whales drawn as one small bar chart each, at most; more make a heatmap
_DETAIL_PACKAGES = 30  # packages named on the detail chart's y axis; the rest are "other"

_WHALE_COLOR = "#e4572e"
_OTHER_COLOR = "#9cc3e6"
_MUTED = "#6b7280"

WIDTH = 400.0  # units (points) of every chart's width
SMALL_TEXT = 10.0  # font sizes, in the same units: the smallest, for dense labels
_TEXT = 10.5
_TITLE = 12.5
_TICK = 3.5  # a tick mark's length


def _short(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis): labels must fit beside a chart."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _label(whale: Whale, limit: int = 30) -> str:
    return _short(f"{whale.name} ({_short(whale.country or '??', 12)})", limit)


def _about(view: str, date: str, whales: int) -> dict[str, str]:
    return {"view": view, "day": date, "whales": str(whales)}


@dataclass(frozen=True)
class _Box:
    """A plot area on the canvas, in points."""

    left: float
    top: float
    width: float
    height: float

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def hour(self, h: float) -> float:
        """x of hour ``h``'s middle: 24 hours from -0.6 to 23.6."""
        return self.left + (h + 0.6) / (HOURS + 0.2) * self.width

    def up(self, value: float, top: float) -> float:
        """y of ``value`` on a count axis from 0 (bottom) to ``top``."""
        return self.bottom - value / top * self.height


def _count_labels(scale: list[int]) -> list[str]:
    return [f"{tick:,}" for tick in scale]


def _y_counts(canvas: Canvas, box: _Box, scale: list[int], labels: bool = True, size: float = _TEXT) -> None:
    """The left spine with the count ticks of ``scale`` (their labels unless ``labels`` is off)."""
    canvas.line(box.left, box.top, box.left, box.bottom)
    for tick, label in zip(scale, _count_labels(scale), strict=True):
        y = box.up(tick, scale[-1])
        canvas.line(box.left - _TICK, y, box.left, y)
        if labels:
            canvas.text(box.left - _TICK - 2, y, label, size, anchor="end", middle=True)


def _x_hours(canvas: Canvas, box: _Box, labels: bool = True, size: float = _TEXT) -> None:
    """The bottom spine with hour ticks every 3 hours (their labels unless ``labels`` is off)."""
    canvas.line(box.left, box.bottom, box.left + box.width, box.bottom)
    for h in range(0, HOURS, 3):
        x = box.hour(h)
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        if labels:
            canvas.text(x, box.bottom + _TICK + size, str(h), size, anchor="middle")


def _title(canvas: Canvas, text: str, subtitle: str = "") -> None:
    """The title on the first line and, if given, a smaller grey subtitle under it."""
    canvas.text(8, 6 + _TITLE, text, _TITLE)
    if subtitle:
        canvas.text(8, 20 + _TITLE, subtitle, SMALL_TEXT, fill=_MUTED)


def render_traffic(date: str, aggregate: DayAggregate, whales: Sequence[Whale]) -> bytes:
    """Downloads per hour, stacked: the top whales below, everyone else above."""
    whale_counts = [sum(w.hourly[h] for w in whales) for h in range(HOURS)]
    others = [max(aggregate.hourly[h] - whale_counts[h], 0) for h in range(HOURS)]
    scale = ticks(max(w + o for w, o in zip(whale_counts, others, strict=True)) * 1.05)
    canvas = Canvas(WIDTH, 250, _about("traffic", date, len(whales)))
    left = 8 + max(text_width(label, _TEXT) for label in _count_labels(scale)) + _TICK + 2
    box = _Box(left, 52, canvas.width - left - 8, canvas.height - 52 - 22)
    share = sum(whale_counts) / max(aggregate.downloads, 1)
    _title(canvas, f"Downloads per hour (UTC), {date}")
    x = 8.0
    for color, label in ((_WHALE_COLOR, f"top {len(whales)} whales: {share:.0%}"), (_OTHER_COLOR, "everyone else")):
        canvas.rect(x, 29, 12, 8, color)
        canvas.text(x + 16, 33, label, _TEXT, middle=True)
        x += 16 + text_width(label, _TEXT) + 14
    half = 0.8 / (HOURS + 0.2) * box.width / 2  # half a bar: 0.8 of an hour wide
    for h in range(HOURS):
        x, base, stacked = (
            box.hour(h) - half,
            box.up(whale_counts[h], scale[-1]),
            box.up(whale_counts[h] + others[h], scale[-1]),
        )
        tip = f"{h:02d}h: {whale_counts[h]:,} by the whales"
        canvas.rect(x, base, 2 * half, box.bottom - base, _WHALE_COLOR, f"traffic-whales-{h}", tip)
        tip = f"{h:02d}h: {others[h]:,} by everyone else"
        canvas.rect(x, stacked, 2 * half, base - stacked, _OTHER_COLOR, f"traffic-others-{h}", tip)
    _y_counts(canvas, box, scale)
    _x_hours(canvas, box)
    return canvas.svg()


def render_whales(date: str, whales: Sequence[Whale]) -> bytes:
    """Horizontal bars: downloads of the biggest whales (at most BARS), the biggest on top."""
    shown = whales[:BARS]
    row = 17.0
    canvas = Canvas(WIDTH, 50 + row * max(len(shown), 3) + 26, _about("whales", date, len(whales)))
    labels = [_label(w) for w in shown]
    values = [f"{w.downloads:,}" for w in shown]
    scale = ticks(max((w.downloads for w in shown), default=0))
    left = 8 + max((text_width(label, _TEXT) for label in labels), default=0) + _TICK + 2
    # right of the axis: the longest bar's value label, and half the last tick's label
    room = max([text_width(value, SMALL_TEXT) + 5 for value in values] + [text_width(f"{scale[-1]:,}", SMALL_TEXT) / 2])
    box = _Box(left, 46, max(canvas.width - left - room - 4, 60.0), row * max(len(shown), 3))
    if len(whales) > len(shown):
        subtitle = f"the top {len(shown)} of {len(whales)}; the table lists all {len(whales)}"
    else:
        subtitle = f"downloads of each of the top {len(whales)}"
    _title(canvas, f"Biggest whales, {date}", subtitle)
    for i, whale in enumerate(shown):
        y = box.top + i * row
        width = whale.downloads / scale[-1] * box.width
        tip = f"{labels[i]}: {values[i]}"
        canvas.rect(box.left, y + 0.12 * row, width, 0.76 * row, _WHALE_COLOR, f"whale-bar-{i}", tip)
        canvas.text(box.left - _TICK - 2, y + row / 2, labels[i], _TEXT, anchor="end", middle=True)
        canvas.text(box.left + width + 3, y + row / 2, values[i], SMALL_TEXT, middle=True)
    canvas.line(box.left, box.top, box.left, box.bottom)
    canvas.line(box.left, box.bottom, box.left + box.width, box.bottom)
    step = max(1, -(-len(scale) // 4))  # at most 4 labelled ticks: they must not touch on a phone
    for n, (tick, label) in enumerate(zip(scale, _count_labels(scale), strict=True)):
        x = box.left + tick / scale[-1] * box.width
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        if n % step == 0:
            canvas.text(x, box.bottom + _TICK + SMALL_TEXT + 1, label, SMALL_TEXT, anchor="middle")
    return canvas.svg()


def render_hourly(date: str, whales: Sequence[Whale]) -> bytes:
    """Each whale's downloads per hour: small multiples up to SMALL_MULTIPLES whales, a heatmap beyond."""
    if len(whales) > SMALL_MULTIPLES:
        return _render_heatmap(date, whales)
    columns = 1 if len(whales) <= 1 else 2
    rows = max(1, -(-len(whales) // columns))
    panel = 96.0
    canvas = Canvas(WIDTH, 34 + rows * panel, _about("hourly", date, len(whales)))
    scale = ticks(max((max(w.hourly) for w in whales), default=0) * 1.05, 3)  # one y axis for all
    gutter = 8 + max(text_width(label, SMALL_TEXT) for label in _count_labels(scale))
    cell_width = (canvas.width - 8) / columns
    _title(canvas, f"Whales by hour (UTC), {date}")
    half = 0.85 / (HOURS + 0.2) / 2
    for i, whale in enumerate(whales):
        row, column = divmod(i, columns)
        left = 8 + column * cell_width
        box = _Box(left + gutter, 34 + row * panel + 16, cell_width - gutter - 10, panel - 16 - 24)
        with canvas.group(f"whale-panel-{i}"):
            canvas.text(left, box.top - 6, _label(whale), _TEXT)
            for h, count in enumerate(whale.hourly):
                y = box.up(count, scale[-1])
                width = 2 * half * box.width
                canvas.rect(box.hour(h) - width / 2, y, width, box.bottom - y, _WHALE_COLOR, tip=f"{h:02d}h: {count:,}")
            _y_counts(canvas, box, scale, labels=True, size=SMALL_TEXT)
            _x_hours(canvas, box, size=SMALL_TEXT)
    return canvas.svg()


# matplotlib's "Oranges" (ColorBrewer's 9-class sequential scheme), light to dark
_ORANGES = ("#fff5eb", "#fee6ce", "#fdd0a2", "#fdae6b", "#fd8d3c", "#f16913", "#d94801", "#a63603", "#7f2704")
_NONE = "#eef0f3"  # a heatmap cell of no downloads: grey, apart from the scale
_LIGHTEST = 0.15  # where one download an hour starts on the scale (its lightest colours are too close to white)


def _blend(fraction: float) -> str:
    """The colour at ``fraction`` (0..1) along the Oranges scale, interpolated between its classes."""
    position = fraction * (len(_ORANGES) - 1)
    low = min(int(position), len(_ORANGES) - 2)
    a, b = _ORANGES[low], _ORANGES[low + 1]
    mix = position - low
    channels = (round(int(a[k : k + 2], 16) * (1 - mix) + int(b[k : k + 2], 16) * mix) for k in (1, 3, 5))
    return "#" + "".join(f"{c:02x}" for c in channels)


_PALETTE = [_blend(n / 255) for n in range(256)]  # a heatmap's cell is a lookup, not a blend


def _orange(fraction: float) -> str:
    """The colour at ``fraction`` (0..1, clipped) along the Oranges scale, in 256 steps."""
    return _PALETTE[round(min(max(fraction, 0.0), 1.0) * 255)]


def heat(count: int, top: int) -> float:
    """Where ``count`` downloads an hour fall on the heatmap's log scale, whose darkest is ``top``:
    1 at _LIGHTEST, ``top`` at 1, each tenfold the same step (so 10 and 100 differ as much as
    100 and 1,000, and the whales below the two biggest are not all pale); 0 for none."""
    if count <= 0:
        return 0.0
    if top <= 1:
        return 1.0
    return _LIGHTEST + (1 - _LIGHTEST) * math.log(min(count, top)) / math.log(top)


def _heat_color(count: int, top: int) -> str:
    return _orange(heat(count, top)) if count > 0 else _NONE


def _log_ticks(top: int) -> list[int]:
    """1, 10, 100, ... up to ``top``, and ``top`` itself unless it is within 2x of the last."""
    found = [10**k for k in range(len(str(top))) if 10**k <= top]
    if top > 2 * found[-1]:
        found.append(top)
    elif top != found[-1]:
        found[-1] = top
    return found


def _heat_legend(canvas: Canvas, top: int, y: float) -> None:
    """The colour scale at ``y``: a "0" swatch, then a bar from 1 to ``top`` with log ticks."""
    canvas.text(8, y, "colour: downloads per hour, log scale", SMALL_TEXT, fill=_MUTED)
    bar = _Box(34, y + 6, canvas.width - 34 - 4 - text_width(f"{top:,}", SMALL_TEXT) / 2, 9)  # room for its last label
    canvas.rect(8, bar.top, 14, bar.height, _NONE, "whale-heatmap-none")
    canvas.text(15, bar.bottom + SMALL_TEXT + 3, "0", SMALL_TEXT, anchor="middle")
    canvas.gradient(
        "whale-heatmap-scale", [_orange(_LIGHTEST + (1 - _LIGHTEST) * i / 8) for i in range(9)], across=True
    )
    canvas.rect(bar.left, bar.top, bar.width, bar.height, "url(#whale-heatmap-scale)", "whale-heatmap-legend")
    for tick in _log_ticks(top):
        x = bar.left + (math.log(tick) / math.log(top) if top > 1 else 1.0) * bar.width
        canvas.line(x, bar.bottom, x, bar.bottom + _TICK)
        canvas.text(x, bar.bottom + SMALL_TEXT + 3, f"{tick:,}", SMALL_TEXT, anchor="middle")


def _render_heatmap(date: str, whales: Sequence[Whale]) -> bytes:
    """Whales (rows, biggest first) by hour (columns), the hours on top and bottom, the colour
    scale (log) on top: a tall heatmap reads from its first rows."""
    row = 13.0
    labels = [_label(w, 28) for w in whales]
    top = max(max(w.hourly) for w in whales)
    left = 8 + max(text_width(label, SMALL_TEXT) for label in labels) + _TICK + 2
    box = _Box(left, 84, WIDTH - left - 8, row * len(whales))
    canvas = Canvas(WIDTH, box.bottom + 20, _about("hourly", date, len(whales)))
    _title(canvas, f"Whales by hour (UTC), {date}")
    _heat_legend(canvas, top, 34)
    cell = box.width / HOURS
    pixels = [[_heat_color(count, top) for count in whale.hourly] for whale in whales]
    canvas.image(box.left, box.top, box.width, box.height, png(pixels), "whale-heatmap")
    for i, label in enumerate(labels):
        canvas.text(box.left - _TICK - 2, box.top + (i + 0.5) * row, label, SMALL_TEXT, anchor="end", middle=True)
    for h in range(0, HOURS, 3):
        x = box.left + (h + 0.5) * cell
        canvas.line(x, box.top - _TICK, x, box.top)
        canvas.text(x, box.top - _TICK - 2, str(h), SMALL_TEXT, anchor="middle")
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        canvas.text(x, box.bottom + _TICK + SMALL_TEXT + 1, str(h), SMALL_TEXT, anchor="middle")
    return canvas.svg()


def _hours(time: str) -> float:
    """An HH:MM:SS time as hours of the day (0.0 when it is not one)."""
    try:
        return (int(time[0:2]) * 3600 + int(time[3:5]) * 60 + int(time[6:8])) / 3600
    except ValueError:
        return 0.0


_CLOCK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 240, 360)  # minutes between the detail's time ticks


def _clock_ticks(first: float, last: float) -> list[float]:
    """Ticks (hours of day) at round clock times within ``first`` .. ``last``, at most 5 (their
    labels must not touch on a phone)."""
    step = next((m for m in _CLOCK_STEPS if (last - first) * 60 / m <= 4), _CLOCK_STEPS[-1]) / 60
    start = -(-first // step) * step
    return [start + i * step for i in range(int((last - start) / step + 1e-9) + 1)]


def render_detail(date: str, mine: list[Row], ip_id: int) -> bytes | None:
    """One ip_id's downloads (its rows: tiny.analytics.rows.rows_of): time of day x package
    (its most downloaded packages by name)."""
    if not mine:
        return None
    packages = [row.package or "NA" for row in mine]
    counts = ranked(packages)
    named = [package for package, _ in counts[:_DETAIL_PACKAGES]]
    more = len(counts) - len(named)
    # bottom to top: "other" last in the list read from the top, then packages by name
    order = ([f"({more} other packages)"] if more else []) + sorted(named, key=str.lower, reverse=True)
    line_of = {package: i for i, package in enumerate(order)}
    x = [_hours(row.time) for row in mine]
    y = [line_of.get(p, 0) for p in packages]
    labels = [_short(package, 24) for package in order]
    row = 13.0
    left = 8 + max(text_width(label, SMALL_TEXT) for label in labels) + _TICK + 2
    box = _Box(left, 46, WIDTH - left - 4 - text_width("00:00", SMALL_TEXT) / 2, row * len(order))  # room for 24:00
    canvas = Canvas(WIDTH, box.bottom + 34, {"view": "detail", "day": date, "ip-id": str(ip_id)})
    name = whale_name(date, ip_id)
    _title(canvas, f"{name} (ip_id {ip_id})", f"{date}: {len(mine):,} downloads of {len(counts):,} packages")
    pad = max((max(x) - min(x)) * 0.03, 1 / 60)
    first, last = max(min(x) - pad, 0.0), min(max(x) + pad, float(HOURS))

    def middle(i: int) -> float:  # package i's middle: len(order) - i - 0.5 rows from the top
        return box.top + (len(order) - i - 0.5) * row

    for i, label in enumerate(labels):
        canvas.line(box.left, middle(i), box.left + box.width, middle(i), "#eeeeee")
        canvas.text(box.left - _TICK - 2, middle(i), label, SMALL_TEXT, anchor="end", middle=True)
    # The points: one raster of 2 pixels a point, each download a "|" mark (thousands of them
    # would otherwise be an element each).
    marks = Marks(round(box.width * 2), round(box.height * 2))
    scale, half = marks.width / (last - first), max(1, min(round(row * 0.6), 7))
    for hours, i in zip(x, y, strict=True):
        centre = round((middle(i) - box.top) * 2)
        marks.bar(round((hours - first) * scale) - 1, centre - half, centre + half, thickness=2)
    canvas.image(box.left, box.top, box.width, box.height, marks.png(_WHALE_COLOR), "detail-points", opacity=0.7)
    canvas.line(box.left, box.top, box.left, box.bottom)
    canvas.line(box.left, box.bottom, box.left + box.width, box.bottom)
    for tick in _clock_ticks(first, last):
        at = box.left + (tick - first) / (last - first) * box.width
        minutes = round(tick * 60)
        canvas.line(at, box.bottom, at, box.bottom + _TICK)
        canvas.text(
            at,
            box.bottom + _TICK + SMALL_TEXT + 1,
            f"{minutes // 60:02d}:{minutes % 60:02d}",
            SMALL_TEXT,
            anchor="middle",
        )
    canvas.text(
        box.left + box.width / 2, canvas.height - 5, "time of day (UTC)", SMALL_TEXT, anchor="middle", fill=_MUTED
    )
    return canvas.svg()


def render(view: str, date: str, aggregate: DayAggregate) -> bytes:
    """One of the views drawn from a day's aggregate (tiny.analytics.answers.day_aggregate: its
    whales are the top N to show): ``traffic``, ``whales`` or ``hourly``."""
    whales = aggregate.whales
    if view == "traffic":
        return render_traffic(date, aggregate, whales)
    if view == "whales":
        return render_whales(date, whales)
    assert view == "hourly"
    return render_hourly(date, whales)


def detail_job(day: DayFile, ip_id: int) -> bytes | None:
    """Pool job: the ``detail`` view of one ip_id (read from its rows); None when
    it has no downloads that day."""
    return render_detail(day.date, rows_of(day, ip_id), ip_id)
