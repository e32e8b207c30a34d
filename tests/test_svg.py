"""The SVG writer of the charts drawn from aggregates (tiny.analytics.svg) and the views it draws."""

from __future__ import annotations

import io
import random
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from PIL import Image

from tiny.analytics import charts
from tiny.analytics.svg import Canvas, Marks, escape, png, text_width, ticks

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


def _aggregate(top: int) -> dict[str, Any]:
    rng = random.Random(top)
    whales = [
        {"ip_id": n, "name": f"whale_{n}", "country": "x" * 12, "downloads": 10_000 - n, "bytes": 1,
         "hourly": [rng.randint(0, 10**6) for _ in range(24)]}
        for n in range(1, top + 1)
    ]  # fmt: skip
    hourly = [sum(w["hourly"][h] for w in whales) + 7 for h in range(24)]
    return {"downloads": sum(hourly), "bytes": 1, "downloaders": top + 1, "hourly": hourly, "whales": whales}


def test_each_whale_bar_is_as_long_as_its_downloads() -> None:
    aggregate = _aggregate(5)
    root = ET.fromstring(charts.render("whales", "2014-05-04", aggregate))
    widths = [float(root.find(f".//{_SVG}rect[@id='whale-bar-{i}']").get("width")) for i in range(5)]  # type: ignore[union-attr,arg-type]
    downloads = [w["downloads"] for w in aggregate["whales"]]
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
        assert ratio == pytest.approx(7 / sum(w["hourly"][h] for w in aggregate["whales"]), rel=0.05, abs=0.01)


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
    assert 1 <= len(found) <= 9 and all(first - 1e-9 <= tick <= last + 1e-9 for tick in found)
    steps = {b - a for a, b in zip(minutes, minutes[1:], strict=False)}
    assert len(steps) <= 1 and all(step in charts._CLOCK_STEPS for step in steps)
    assert all(m % step == 0 for step in steps for m in minutes)  # 12:15, 12:30..., not 12:07
