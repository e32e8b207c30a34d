"""The SVG writer of the charts drawn from aggregates (tiny.analytics.svg) and the views it draws."""

from __future__ import annotations

import base64
import io
import math
import random
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
from PIL import Image

from tiny.analytics import charts
from tiny.analytics.answers import DayAggregate, Whale
from tiny.analytics.svg import Canvas, Marks, escape, png, text_width, ticks
from tiny.cranlog import Row

_SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("top", [0, 0.5, 1, 3, 7, 99, 100, 101, 12_345, 10**12 + 1])
def test_ticks_cover_the_top_in_equal_round_whole_steps(top: float) -> None:
    scale = ticks(top)
    steps = {b - a for a, b in zip(scale, scale[1:], strict=False)}
    assert scale[0] == 0 and scale[-1] >= top and len(steps) == 1
    (step,) = steps
    assert step >= 1 and str(step).rstrip("0") in ("1", "2", "25", "5")
    assert len(scale) <= 12


def test_text_with_markup_and_characters_xml_forbids_stays_plain_text() -> None:
    canvas = Canvas(100, 50)
    canvas.text(1, 20, '<b>&amp; "x" \x01\x1f\ufffe')
    canvas.rect(0, 0, 5, 5, "#000000", id='a"b', tip="<tip>")
    root = ET.fromstring(canvas.svg())
    assert root.find(f"{_SVG}text").text == '<b>&amp; "x" \ufffd\ufffd\ufffd'  # type: ignore[union-attr]
    assert root.find(f"{_SVG}rect[@id='a\"b']/{_SVG}title").text == "<tip>"  # type: ignore[union-attr]
    assert escape("\ud800") == "\ufffd"  # a lone surrogate (a string from JSON may hold one)


def test_an_embedded_png_holds_the_pixels_given() -> None:
    pixels = [["#ff0000", "#00ff00", "#0000ff"], ["#000000", "#ffffff", "#7f2704"]]
    image = Image.open(io.BytesIO(png(pixels)))
    assert image.size == (3, 2) and image.mode == "RGB"
    assert [image.getpixel((x, y)) for y in range(2) for x in range(3)] == [
        (255, 0, 0), (0, 255, 0), (0, 0, 255), (0, 0, 0), (255, 255, 255), (127, 39, 4),
    ]  # fmt: skip


def test_wide_characters_are_counted_wider_than_latin_ones() -> None:
    assert text_width("abcd", 10) < text_width("مرحبا", 10) < text_width("🐳🐳🐳🐳🐳", 10)
    assert text_width("x" * 40, 10) == pytest.approx(4 * text_width("x" * 10, 10))


def _aggregate(top: int) -> DayAggregate:
    rng = random.Random(top)
    whales = tuple(
        Whale(n, f"whale_{n}", "x" * 12, 10_000 - n, 1, tuple(rng.randint(0, 10**6) for _ in range(24)))
        for n in range(1, top + 1)
    )
    hourly = tuple(sum(w.hourly[h] for w in whales) + 7 for h in range(24))
    return DayAggregate(sum(hourly), 1, top + 1, hourly, whales)


def _hours_of(aggregate: DayAggregate, hourly: Callable[[int, Whale], Sequence[int]]) -> DayAggregate:
    """``aggregate`` with each whale's hours ``hourly(its place, it)``."""
    whales = tuple(replace(whale, hourly=tuple(hourly(n, whale))) for n, whale in enumerate(aggregate.whales))
    return replace(aggregate, whales=whales)


def test_each_whale_bar_is_as_long_as_its_downloads() -> None:
    aggregate = _aggregate(5)
    root = ET.fromstring(charts.render("whales", "2014-05-04", aggregate))
    widths = [float(root.find(f".//{_SVG}rect[@id='whale-bar-{i}']").get("width")) for i in range(5)]  # type: ignore[union-attr,arg-type]
    downloads = [w.downloads for w in aggregate.whales]
    assert [round(w / widths[0], 3) for w in widths] == [round(d / downloads[0], 3) for d in downloads]


def test_a_traffic_bar_stacks_everyone_else_on_the_whales() -> None:
    aggregate = _aggregate(3)
    root = ET.fromstring(charts.render("traffic", "2014-05-04", aggregate))
    for h in (0, 11, 23):
        whales = root.find(f".//{_SVG}rect[@id='traffic-whales-{h}']")
        others = root.find(f".//{_SVG}rect[@id='traffic-others-{h}']")
        assert whales is not None and others is not None
        assert float(others.get("y", 0)) + float(others.get("height", 0)) == pytest.approx(float(whales.get("y", 0)))
        ratio = float(others.get("height", 0)) / float(whales.get("height", 1))
        assert ratio == pytest.approx(7 / sum(w.hourly[h] for w in aggregate.whales), rel=0.05, abs=0.01)


@pytest.mark.parametrize("view", charts.FROM_AGGREGATES)
@pytest.mark.parametrize("top", [1, 12, 13, 100])
def test_every_view_of_up_to_100_whales_is_a_bounded_well_formed_svg(view: str, top: int) -> None:
    svg = charts.render(view, "2014-05-04", _aggregate(top))
    ET.fromstring(svg)
    assert len(svg) < 64 * 1024  # a heatmap's cells are one embedded PNG, not 2,400 elements


def test_marks_are_opaque_pixels_on_a_transparent_ground() -> None:
    marks = Marks(6, 5)
    marks.bar(2, 1, 3, thickness=2)
    marks.bar(5, -10, 10, thickness=4)  # clipped to the raster
    image = Image.open(io.BytesIO(marks.png("#e4572e"))).convert("RGBA")
    opaque = {(x, y) for y in range(5) for x in range(6) if image.getpixel((x, y))[3] == 255}  # type: ignore[index]
    assert opaque == {(x, y) for x in (2, 3) for y in (1, 2, 3)} | {(5, y) for y in range(5)}
    assert image.getpixel((2, 1)) == (0xE4, 0x57, 0x2E, 255)
    assert image.getpixel((0, 0))[3] == 0  # type: ignore[index]


@pytest.mark.parametrize(("first", "last"), [(0.0, 24.0), (1.78, 2.27), (12.40, 13.07), (5.0, 5.02), (23.9, 24.0)])
def test_the_detail_charts_time_ticks_fall_on_round_clock_times(first: float, last: float) -> None:
    found = charts._clock_ticks(first, last)
    minutes = [round(tick * 60) for tick in found]
    assert 1 <= len(found) <= 5 and all(first - 1e-9 <= tick <= last + 1e-9 for tick in found)
    steps = {b - a for a, b in zip(minutes, minutes[1:], strict=False)}
    assert len(steps) <= 1 and all(step in charts._CLOCK_STEPS for step in steps)
    assert all(m % step == 0 for step in steps for m in minutes)  # 12:15, 12:30..., not 12:07


def _detail(packages: int) -> bytes:
    rows = [
        Row(f"{h:02d}:{m:02d}:00", h, 1, f"package-with-a-long-name-{n}", "1.0", "US", 2**64 - 1)
        for n in range(packages)
        for h, m in ((n % 24, n % 60), (23 - n % 24, 59 - n % 60))
    ]
    svg = charts.render_detail("2014-05-04", rows, 2**64 - 1)
    assert svg is not None
    return svg


def _views(top: int) -> list[bytes]:
    return [charts.render(view, "2014-05-04", _aggregate(top)) for view in charts.FROM_AGGREGATES]


@pytest.mark.parametrize("top", [1, 6, 7, 100])
def test_every_chart_says_which_day_and_how_many_whales_it_is_of(top: int) -> None:
    for view, svg in zip(charts.FROM_AGGREGATES, _views(top), strict=True):
        root = ET.fromstring(svg)
        assert (root.get("data-view"), root.get("data-day"), root.get("data-whales")) == (view, "2014-05-04", str(top))
    root = ET.fromstring(_detail(3))
    assert (root.get("data-view"), root.get("data-day"), root.get("data-ip-id")) == (
        "detail",
        "2014-05-04",
        str(2**64 - 1),
    )


def test_the_day_on_a_charts_root_is_escaped() -> None:
    root = ET.fromstring(Canvas(10, 10, {"day": '"><script>'}).svg())
    assert root.get("data-day") == '"><script>'


@pytest.mark.parametrize("svg", [*_views(1), *_views(6), *_views(100), _detail(3), _detail(40)])
def test_every_text_is_at_least_the_smallest_size_and_inside_the_chart(svg: bytes) -> None:
    """A chart is WIDTH wide and its text SMALL_TEXT or more, so that it reads on a phone (the
    page shows it about 1:1 there); no label, long names and countries included, runs off it."""
    root = ET.fromstring(svg)
    assert root.get("viewBox", "").split()[2] == f"{charts.WIDTH:g}"
    for text in root.iter(f"{_SVG}text"):
        size, x = float(text.get("font-size", 0)), float(text.get("x", 0))
        assert size >= charts.SMALL_TEXT
        if text.get("transform"):
            continue
        width = text_width(text.text or "", size)
        left = {"start": x, "middle": x - width / 2, "end": x - width}[text.get("text-anchor", "start")]
        assert 0 <= left and left + width <= charts.WIDTH, (text.text, left, width)


def test_at_most_20_whales_are_bars_and_the_chart_says_the_table_has_the_rest() -> None:
    root = ET.fromstring(charts.render("whales", "2014-05-04", _aggregate(100)))
    bars = [el.get("id") for el in root.iter(f"{_SVG}rect") if el.get("id", "").startswith("whale-bar-")]
    assert bars == [f"whale-bar-{i}" for i in range(charts.BARS)] and charts.BARS == 20
    assert "the top 20 of 100; the table lists all 100" in [el.text for el in root.iter(f"{_SVG}text")]


def test_up_to_6_whales_by_hour_are_small_multiples_and_more_a_heatmap() -> None:
    for top, panels in ((6, 6), (7, 0)):
        root = ET.fromstring(charts.render("hourly", "2014-05-04", _aggregate(top)))
        found = [el for el in root.iter(f"{_SVG}g") if el.get("id", "").startswith("whale-panel-")]
        assert len(found) == panels
        assert (root.find(f".//{_SVG}image[@id='whale-heatmap']") is not None) == (panels == 0)


def _heatmap_cells(svg: bytes) -> list[list[tuple[int, int, int]]]:
    image = ET.fromstring(svg).find(f".//{_SVG}image[@id='whale-heatmap']")
    assert image is not None
    cells = Image.open(io.BytesIO(base64.b64decode(image.get("href", "").split(",", 1)[1]))).convert("RGB")
    return [[cells.getpixel((x, y)) for x in range(cells.width)] for y in range(cells.height)]  # type: ignore[misc]


def test_the_heatmap_scale_is_logarithmic_so_that_small_whales_are_not_all_pale() -> None:
    """Counts 1, 10, 100, 1,000 and 10,000 an hour are evenly spaced on the colour scale (on the
    linear one, all but the biggest were within the palest tenth); no downloads is grey, off it."""
    aggregate = _hours_of(_aggregate(8), lambda n, _: [10 ** min(n, 4) if h == n else 0 for h in range(24)])
    cells = _heatmap_cells(charts.render("hourly", "2014-05-04", aggregate))
    shown = [cells[n][n] for n in range(5)]
    colors = [charts._orange(charts.heat(10**n, 10**4)) for n in range(5)]
    assert shown == [tuple(int(color[k : k + 2], 16) for k in (1, 3, 5)) for color in colors]
    steps = [charts.heat(10**n, 10**4) for n in range(5)]
    assert steps[0] == charts._LIGHTEST and steps[-1] == 1
    assert [round(b - a, 9) for a, b in zip(steps, steps[1:], strict=False)] == [
        round((1 - charts._LIGHTEST) / 4, 9)
    ] * 4
    none = cells[0][5]
    assert none == tuple(int(charts._NONE[k : k + 2], 16) for k in (1, 3, 5)) and none not in shown
    ink = [sum(color) for color in shown]
    assert ink == sorted(ink, reverse=True) and len(set(ink)) == 5  # darker with each tenfold


def test_the_heatmap_legend_says_its_scale_is_logarithmic_with_ticks_at_powers_of_ten() -> None:
    aggregate = _hours_of(
        _aggregate(10),
        lambda n, whale: [5_371 if (n, h) == (0, 3) else min(c, 5_371) for h, c in enumerate(whale.hourly)],
    )
    root = ET.fromstring(charts.render("hourly", "2014-05-04", aggregate))
    texts = [el.text for el in root.iter(f"{_SVG}text")]
    assert "colour: downloads per hour, log scale" in texts
    assert {"0", "1", "10", "100", "1,000", "5,371"} <= set(texts)
    legend = root.find(f".//{_SVG}rect[@id='whale-heatmap-legend']")
    assert legend is not None and legend.get("fill") == "url(#whale-heatmap-scale)"


@pytest.mark.parametrize(("top", "expected"), [(1, [1]), (9, [1, 9]), (10, [1, 10]), (15, [1, 15]), (25, [1, 10, 25])])
def test_the_heatmap_legend_ticks_end_at_the_top_count(top: int, expected: list[int]) -> None:
    assert charts._log_ticks(top) == expected


def test_one_download_an_hour_at_most_is_the_darkest_colour() -> None:
    assert charts.heat(1, 1) == 1 and charts.heat(0, 1) == 0 and charts.heat(0, 10) == 0
    assert math.isclose(charts.heat(10, 100), charts._LIGHTEST + (1 - charts._LIGHTEST) / 2)
