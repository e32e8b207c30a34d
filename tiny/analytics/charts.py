"""The dashboard's charts, written as SVG (tiny.analytics.svg) in an analytics pool process.

:func:`render` draws the ``traffic``, ``whales`` and ``hourly`` views from a day's aggregate
(tiny.analytics.store, small data: 24 hours and N whales), 0-4 ms of CPU each;
:func:`detail_job` draws one ip_id's downloads from its rows (tiny.analytics.compute),
the one view that reads them (its thousands of points one embedded image).
Element ids name what the tests count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiny.analytics.compute import HOURS, DayFile, ranked, rows_of
from tiny.analytics.names import whale_name
from tiny.analytics.svg import Canvas, Marks, png, text_width, ticks
from tiny.cranlog import Row

VIEWS = ("traffic", "whales", "hourly", "detail")
FROM_AGGREGATES = ("traffic", "whales", "hourly")  # the others read rows
_DETAIL_PACKAGES = 30  # packages named on the detail chart's y axis; the rest are "other"

_WHALE_COLOR = "#e4572e"
_OTHER_COLOR = "#9cc3e6"


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis): labels must fit beside a chart."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _label(whale: dict[str, Any]) -> str:
    return f"{whale['name']} ({_short(whale['country'] or '??', 12)})"


# Written as SVG directly (tiny.analytics.svg), where matplotlib took 0.1-1 s of CPU a chart
# (BENCHMARKS.md); they keep its figure sizes (points: 72 to the inch), colours and element ids.
_PT = 72
_TITLE = 12  # points: a title's font size (matplotlib's "large")
_TICK = 3.5  # points: a tick mark's length


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
        """x of hour ``h``'s middle: 24 hours from -0.6 to 23.6, as matplotlib's limits were."""
        return self.left + (h + 0.6) / (HOURS + 0.2) * self.width

    def up(self, value: float, top: float) -> float:
        """y of ``value`` on a count axis from 0 (bottom) to ``top``."""
        return self.bottom - value / top * self.height


def _count_labels(scale: list[int]) -> list[str]:
    return [f"{tick:,}" for tick in scale]


def _y_counts(canvas: Canvas, box: _Box, scale: list[int], labels: bool = True, size: float = 10) -> None:
    """The left spine with the count ticks of ``scale`` (their labels unless ``labels`` is off)."""
    canvas.line(box.left, box.top, box.left, box.bottom)
    for tick, label in zip(scale, _count_labels(scale), strict=True):
        y = box.up(tick, scale[-1])
        canvas.line(box.left - _TICK, y, box.left, y)
        if labels:
            canvas.text(box.left - _TICK - 2, y, label, size, anchor="end", middle=True)


def _x_hours(canvas: Canvas, box: _Box, labels: bool = True, size: float = 10) -> None:
    """The bottom spine with hour ticks every 3 hours (their labels unless ``labels`` is off)."""
    canvas.line(box.left, box.bottom, box.left + box.width, box.bottom)
    for h in range(0, HOURS, 3):
        x = box.hour(h)
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        if labels:
            canvas.text(x, box.bottom + _TICK + size, str(h), size, anchor="middle")


def _title(canvas: Canvas, x: float, text: str) -> None:
    canvas.text(x, 6 + _TITLE, text, _TITLE)


def render_traffic(date: str, aggregate: dict[str, Any], whales: list[dict[str, Any]]) -> bytes:
    """Downloads per hour, stacked: the top whales below, everyone else above."""
    whale_counts = [sum(w["hourly"][h] for w in whales) for h in range(HOURS)]
    others = [max(aggregate["hourly"][h] - whale_counts[h], 0) for h in range(HOURS)]
    scale = ticks(max(w + o for w, o in zip(whale_counts, others, strict=True)) * 1.05)
    canvas = Canvas(9.0 * _PT, 4.2 * _PT)
    left = 30 + max(text_width(label, 10) for label in _count_labels(scale))
    box = _Box(left, 34, canvas.width - left - 12, canvas.height - 34 - 40)
    share = sum(whale_counts) / max(aggregate["downloads"], 1)
    _title(canvas, box.left, f"All traffic by hour (UTC), {date}: top {len(whales)} whales made {share:.0%}")
    half = 0.8 / (HOURS + 0.2) * box.width / 2  # half a bar: 0.8 of an hour wide
    for h in range(HOURS):
        x, base, stacked = (
            box.hour(h) - half,
            box.up(whale_counts[h], scale[-1]),
            box.up(whale_counts[h] + others[h], scale[-1]),
        )
        canvas.rect(
            x,
            base,
            2 * half,
            box.bottom - base,
            _WHALE_COLOR,
            f"traffic-whales-{h}",
            f"{h:02d}h: {whale_counts[h]:,} by the whales",
        )
        canvas.rect(
            x,
            stacked,
            2 * half,
            base - stacked,
            _OTHER_COLOR,
            f"traffic-others-{h}",
            f"{h:02d}h: {others[h]:,} by everyone else",
        )
    _y_counts(canvas, box, scale)
    _x_hours(canvas, box)
    canvas.text(box.left + box.width / 2, canvas.height - 8, "hour of day (UTC)", anchor="middle")
    canvas.text(14, box.top + box.height / 2, "downloads", anchor="middle", rotate=True)
    x = box.left + 8
    for color, label in ((_WHALE_COLOR, f"top {len(whales)} whales"), (_OTHER_COLOR, "everyone else")):
        canvas.rect(x, box.top + 4, 14, 7, color)
        canvas.text(x + 20, box.top + 11, label)
        x += 20 + text_width(label, 10) + 16
    return canvas.svg()


def render_whales(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Horizontal bars: downloads per whale, the biggest on top."""
    canvas = Canvas(6.0 * _PT, (1.0 + 0.3 * max(len(whales), 3)) * _PT)
    labels = [_label(w) for w in whales]
    values = [f"{w['downloads']:,}" for w in whales]
    scale = ticks(max((w["downloads"] for w in whales), default=0) * 1.12)  # room for the value labels
    left = 10 + max((text_width(label, 10) for label in labels), default=0)
    box = _Box(left, 30, max(canvas.width - left - 16, 60.0), canvas.height - 30 - 36)
    _title(canvas, min(box.left, 10.0), f"Biggest whales, {date}")
    row = box.height / max(len(whales), 1)
    for i, whale in enumerate(whales):
        y = box.top + i * row
        width = whale["downloads"] / scale[-1] * box.width
        canvas.rect(
            box.left, y + 0.1 * row, width, 0.8 * row, _WHALE_COLOR, f"whale-bar-{i}", f"{labels[i]}: {values[i]}"
        )
        canvas.text(box.left - _TICK - 2, y + row / 2, labels[i], anchor="end", middle=True)
        canvas.text(box.left + width + 3, y + row / 2, values[i], 8, middle=True)
    canvas.line(box.left, box.top, box.left, box.bottom)
    canvas.line(box.left, box.bottom, box.left + box.width, box.bottom)
    for tick, label in zip(scale, _count_labels(scale), strict=True):
        x = box.left + tick / scale[-1] * box.width
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        canvas.text(x, box.bottom + _TICK + 10, label, anchor="middle")
    canvas.text(box.left + box.width / 2, canvas.height - 6, "downloads", anchor="middle")
    return canvas.svg()


def render_hourly(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Each whale's downloads per hour: small multiples up to 12 whales, a heatmap beyond."""
    if len(whales) > 12:
        return _render_heatmap(date, whales)
    columns = 3 if len(whales) <= 9 else 4
    rows = max(1, -(-len(whales) // columns))
    canvas = Canvas(13.0 * _PT, (0.5 + 1.6 * rows) * _PT)
    scale = ticks(max((max(w["hourly"]) for w in whales), default=0) * 1.05, 3)  # one y axis for all
    gutter = 12 + max(text_width(label, 8) for label in _count_labels(scale))
    cell_width, cell_height = (canvas.width - 10) / columns, (canvas.height - 28) / rows
    canvas.text(10, 6 + _TITLE, f"Whales by hour (UTC), {date}", _TITLE)
    half = 0.85 / (HOURS + 0.2) / 2
    for i, whale in enumerate(whales):
        row, column = divmod(i, columns)
        box = _Box(
            10 + column * cell_width + gutter,
            28 + row * cell_height + 16,
            cell_width - gutter - 8,
            cell_height - 16 - 22,
        )
        below = i + columns < len(whales)  # another panel under this one: its hours say it
        with canvas.group(f"whale-panel-{i}"):
            canvas.text(box.left, box.top - 5, _label(whale), 9)
            for h, count in enumerate(whale["hourly"]):
                y = box.up(count, scale[-1])
                canvas.rect(
                    box.hour(h) - half * box.width,
                    y,
                    2 * half * box.width,
                    box.bottom - y,
                    _WHALE_COLOR,
                    tip=f"{h:02d}h: {count:,}",
                )
            _y_counts(canvas, box, scale, labels=column == 0, size=8)
            _x_hours(canvas, box, labels=not below, size=8)
    return canvas.svg()


# matplotlib's "Oranges" (ColorBrewer's 9-class sequential scheme), light to dark
_ORANGES = ("#fff5eb", "#fee6ce", "#fdd0a2", "#fdae6b", "#fd8d3c", "#f16913", "#d94801", "#a63603", "#7f2704")


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


def _render_heatmap(date: str, whales: list[dict[str, Any]]) -> bytes:
    canvas = Canvas(13.0 * _PT, (1.0 + 0.2 * len(whales)) * _PT)
    labels = [_label(w) for w in whales]
    top = max(max(w["hourly"]) for w in whales) or 1
    scale = [tick for tick in ticks(top) if tick <= top]
    left = 10 + max(text_width(label, 7) for label in labels)
    box = _Box(left, 30, canvas.width - left - 90, canvas.height - 30 - 36)
    _title(canvas, box.left, f"Whales by hour (UTC), {date}")
    cell, row = box.width / HOURS, box.height / len(whales)
    pixels = [[_orange(count / top) for count in whale["hourly"]] for whale in whales]
    canvas.image(box.left, box.top, box.width, box.height, png(pixels), "whale-heatmap")
    for i, label in enumerate(labels):
        canvas.text(box.left - _TICK - 2, box.top + (i + 0.5) * row, label, 7, anchor="end", middle=True)
    for h in range(0, HOURS, 3):
        x = box.left + (h + 0.5) * cell
        canvas.line(x, box.bottom, x, box.bottom + _TICK)
        canvas.text(x, box.bottom + _TICK + 10, str(h), anchor="middle")
    canvas.text(box.left + box.width / 2, canvas.height - 6, "hour of day (UTC)", anchor="middle")
    bar = _Box(box.left + box.width + 16, box.top, 12, box.height)  # the colour bar: 0 at the bottom
    canvas.gradient("whale-heatmap-scale", list(_ORANGES))
    canvas.rect(bar.left, bar.top, bar.width, bar.height, "url(#whale-heatmap-scale)")
    for tick in scale:
        y = bar.up(tick, top)
        canvas.line(bar.left + bar.width, y, bar.left + bar.width + _TICK, y)
        canvas.text(bar.left + bar.width + _TICK + 2, y, f"{tick:,}", 8, middle=True)
    canvas.text(canvas.width - 8, bar.top + bar.height / 2, "downloads", anchor="middle", rotate=True)
    return canvas.svg()


def _hours(time: str) -> float:
    """An HH:MM:SS time as hours of the day (0.0 when it is not one)."""
    try:
        return (int(time[0:2]) * 3600 + int(time[3:5]) * 60 + int(time[6:8])) / 3600
    except ValueError:
        return 0.0


_CLOCK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 240, 360)  # minutes between the detail's time ticks


def _clock_ticks(first: float, last: float) -> list[float]:
    """Ticks (hours of day) at round clock times within ``first`` .. ``last``, at most 9."""
    step = next((m for m in _CLOCK_STEPS if (last - first) * 60 / m <= 8), _CLOCK_STEPS[-1]) / 60
    start = -(-first // step) * step
    return [start + i * step for i in range(int((last - start) / step + 1e-9) + 1)]


def render_detail(date: str, mine: list[Row], ip_id: int) -> bytes | None:
    """One ip_id's downloads (its rows: tiny.analytics.compute.rows_of): time of day x package
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
    labels = [_short(package) for package in order]
    canvas = Canvas(9.0 * _PT, (1.2 + 0.2 * len(order)) * _PT)
    left = 12 + max(text_width(label, 8) for label in labels)
    box = _Box(left, 30, canvas.width - left - 12, canvas.height - 30 - 36)
    name = whale_name(date, ip_id)
    title = f"{name} (ip_id {ip_id}), {date}: {len(mine):,} downloads of {len(counts):,} packages"
    _title(canvas, min(box.left, 10.0), title)
    pad = max((max(x) - min(x)) * 0.03, 1 / 60)
    first, last = max(min(x) - pad, 0.0), min(max(x) + pad, float(HOURS))
    row = box.height / len(order)  # package i's middle: len(order) - i - 0.5 rows from the top

    def middle(i: int) -> float:
        return box.top + (len(order) - i - 0.5) * row

    for i, label in enumerate(labels):
        canvas.line(box.left, middle(i), box.left + box.width, middle(i), "#eeeeee")
        canvas.text(box.left - _TICK - 2, middle(i), label, 8, anchor="end", middle=True)
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
        canvas.text(at, box.bottom + _TICK + 10, f"{minutes // 60:02d}:{minutes % 60:02d}", anchor="middle")
    canvas.text(box.left + box.width / 2, canvas.height - 6, "time of day (UTC)", anchor="middle")
    return canvas.svg()


def render(view: str, date: str, aggregate: dict[str, Any]) -> bytes:
    """One of the views drawn from a day's aggregate (tiny.analytics.store.day_aggregate: its
    whales are the top N to show): ``traffic``, ``whales`` or ``hourly``."""
    whales = aggregate["whales"]
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
