"""The dashboard's charts: matplotlib figures drawn as SVG, in an analytics pool process.

:func:`render` draws the ``traffic``, ``whales`` and ``hourly`` views from a day's aggregate
(tiny.analytics.store, small data: 24 hours and N whales); :func:`detail_job` draws one
ip_id's downloads from the rows (tiny.analytics.compute, polars), the one view that reads
them. Element ids (``gid``) name what the tests count.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from tiny.analytics.compute import HOURS, DayFile, frame_of
from tiny.analytics.names import whale_name

if TYPE_CHECKING:  # imported in the pool process only: workers never load matplotlib
    import polars as pl
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

VIEWS = ("traffic", "whales", "hourly", "detail")
FROM_AGGREGATES = ("traffic", "whales", "hourly")  # the others read rows
_DETAIL_PACKAGES = 30  # packages named on the detail chart's y axis; the rest are "other"

_WHALE_COLOR = "#e4572e"
_OTHER_COLOR = "#9cc3e6"
_INK = "#333333"


def _figure(width: float, height: float) -> Figure:
    import matplotlib

    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, selectable, searchable
            # Labels are data (package names, countries): never TeX or mathtext. With math
            # on, one package named "$\\bar$" made every chart of its day fail.
            "text.parse_math": False,
            "text.usetex": False,
            "svg.hashsalt": "tiny",  # deterministic element ids
            "font.size": 10,
            "axes.edgecolor": "#999999",
            "axes.labelcolor": _INK,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "xtick.color": _INK,
            "ytick.color": _INK,
        }
    )
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _svg(figure: Figure) -> bytes:
    out = io.BytesIO()
    figure.savefig(out, format="svg", metadata={"Date": None}, dpi=150)  # dpi: of rasterized parts only
    return out.getvalue()


def _short(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis): labels must fit beside a chart."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _label(whale: dict[str, Any]) -> str:
    return f"{whale['name']} ({_short(whale['country'] or '??', 12)})"


def _hour_axis(axes: Axes) -> None:
    axes.set_xlim(-0.6, HOURS - 0.4)
    axes.set_xticks(range(0, HOURS, 3))


def render_traffic(date: str, aggregate: dict[str, Any], whales: list[dict[str, Any]]) -> bytes:
    """Downloads per hour, stacked: the top whales below, everyone else above."""
    hours = range(HOURS)
    whale_counts = [sum(w["hourly"][h] for w in whales) for h in hours]
    others = [aggregate["hourly"][h] - whale_counts[h] for h in hours]
    figure = _figure(9.0, 4.2)
    axes = figure.add_subplot()
    bottom = axes.bar(hours, whale_counts, color=_WHALE_COLOR, label=f"top {len(whales)} whales")
    top = axes.bar(hours, others, bottom=whale_counts, color=_OTHER_COLOR, label="everyone else")
    for h in hours:
        bottom.patches[h].set_gid(f"traffic-whales-{h}")
        top.patches[h].set_gid(f"traffic-others-{h}")
    _hour_axis(axes)
    share = sum(whale_counts) / max(aggregate["downloads"], 1)
    axes.set_title(f"All traffic by hour (UTC), {date}: top {len(whales)} whales made {share:.0%}", loc="left")
    axes.set_xlabel("hour of day (UTC)")
    axes.set_ylabel("downloads")
    axes.legend(frameon=False, loc="upper left", ncols=2)
    return _svg(figure)


def render_whales(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Horizontal bars: downloads per whale, the biggest on top."""
    figure = _figure(6.0, 1.0 + 0.3 * max(len(whales), 3))
    axes = figure.add_subplot()
    labels = [_label(w) for w in whales]
    bars = axes.barh(range(len(whales)), [w["downloads"] for w in whales], color=_WHALE_COLOR)
    for i, bar in enumerate(bars.patches):
        bar.set_gid(f"whale-bar-{i}")
    axes.bar_label(bars, labels=[f"{w['downloads']:,}" for w in whales], padding=3, fontsize=8, color=_INK)
    axes.set_yticks(range(len(whales)), labels)
    axes.invert_yaxis()
    axes.set_xlabel("downloads")
    axes.set_title(f"Biggest whales, {date}", loc="left")
    axes.margins(x=0.12)
    return _svg(figure)


def render_hourly(date: str, whales: list[dict[str, Any]]) -> bytes:
    """Each whale's downloads per hour: small multiples up to 12 whales, a heatmap beyond."""
    if len(whales) > 12:
        return _render_heatmap(date, whales)
    columns = 3 if len(whales) <= 9 else 4
    rows = max(1, -(-len(whales) // columns))
    figure = _figure(13.0, 0.5 + 1.6 * rows)
    grid = figure.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    for i, axes in enumerate(grid.flat):
        if i >= len(whales):
            axes.set_visible(False)
            continue
        axes.set_gid(f"whale-panel-{i}")
        axes.bar(range(HOURS), whales[i]["hourly"], color=_WHALE_COLOR, width=0.85)
        axes.set_title(_label(whales[i]), fontsize=9, loc="left")
        _hour_axis(axes)
    figure.suptitle(f"Whales by hour (UTC), {date}", x=0.01, ha="left")
    return _svg(figure)


def _render_heatmap(date: str, whales: list[dict[str, Any]]) -> bytes:
    figure = _figure(13.0, 1.0 + 0.2 * len(whales))
    axes = figure.add_subplot()
    image = axes.imshow([w["hourly"] for w in whales], aspect="auto", cmap="Oranges", interpolation="nearest")
    image.set_gid("whale-heatmap")
    axes.set_yticks(range(len(whales)), [_label(w) for w in whales], fontsize=7)
    axes.set_xticks(range(0, HOURS, 3))
    axes.set_xlabel("hour of day (UTC)")
    axes.set_title(f"Whales by hour (UTC), {date}", loc="left")
    figure.colorbar(image, ax=axes, label="downloads")
    return _svg(figure)


def _clock(start: int) -> pl.Expr:
    """Hours, minutes or seconds (at ``start``) of the HH:MM:SS time column, as integers."""
    import polars as pl

    return pl.col("time").str.slice(start, 2).cast(pl.Int64, strict=False)


def _time_axis(axes: Axes, first: float, last: float) -> None:
    """The detail chart's x axis: the span the whale was active in (hours of day), as HH:MM."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    pad = max((last - first) * 0.03, 1 / 60)
    axes.set_xlim(max(first - pad, 0), min(last + pad, HOURS))
    axes.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda h, _: f"{int(h):02d}:{round(h % 1 * 60) % 60:02d}"))


def render_detail(date: str, frame: pl.DataFrame, ip_id: int) -> bytes | None:
    """One ip_id's downloads: time of day x package (its most downloaded packages by name)."""
    import polars as pl

    mine = frame.filter(pl.col("ip_id") == ip_id).drop_nulls("hour")
    if mine.height == 0:
        return None
    packages = mine["package"].fill_null("NA")
    counts = packages.value_counts().sort(["count", "package"], descending=[True, False])
    named = counts["package"].head(_DETAIL_PACKAGES).to_list()
    more = counts.height - len(named)
    # bottom to top: "other" last in the list read from the top, then packages by name
    order = ([f"({more} other packages)"] if more else []) + sorted(named, key=str.lower, reverse=True)
    rows = {package: i for i, package in enumerate(order)}
    x = mine.select((_clock(0) * 3600 + _clock(3) * 60 + _clock(6)) / 3600).to_series().fill_null(0.0).to_list()
    y = [rows.get(p, 0) for p in packages.to_list()]
    figure = _figure(9.0, 1.2 + 0.2 * len(order))
    axes = figure.add_subplot()
    # rasterized: thousands of points stay one embedded image instead of an element each
    points = axes.scatter(x, y, s=40, marker="|", color=_WHALE_COLOR, alpha=0.7, linewidths=1.2, rasterized=True)
    points.set_gid("detail-points")
    axes.set_yticks(range(len(order)), [_short(package) for package in order], fontsize=8)
    axes.set_ylim(-0.7, len(order) - 0.3)
    _time_axis(axes, min(x), max(x))
    axes.set_xlabel("time of day (UTC)")
    name = whale_name(date, ip_id)
    title = f"{name} (ip_id {ip_id}), {date}: {mine.height:,} downloads of {counts.height:,} packages"
    axes.set_title(title, loc="left")
    axes.grid(axis="y", color="#eeeeee")
    return _svg(figure)


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


def draw_job(view: str, date: str, aggregate: bytes) -> bytes:
    """Pool job: :func:`render` from the JSON of tiny.analytics.store.day_aggregate (the
    stdlib's parser: byte totals may pass 2^64)."""
    import json

    return render(view, date, json.loads(aggregate))


def detail_job(day: DayFile, ip_id: int) -> bytes | None:
    """Pool job: the ``detail`` view of one ip_id (read from the rows, with polars); None when
    it has no downloads that day."""
    return render_detail(day.date, frame_of(day), ip_id)
