"""A small SVG writer for the charts drawn from aggregates: rectangles, lines and text on a
canvas measured in points (72 to the inch, the unit of matplotlib's SVGs), and the axis
arithmetic they need (ticks, estimated text widths).

Its cost is linear in what is drawn (a few microseconds an element): a chart of 100 whales
is about a millisecond, where matplotlib took 0.1-1 s of CPU for the same chart (text
layout, ticks and constrained layout; BENCHMARKS.md). No font is read: text widths are
estimated from the characters, so labels are placed with room to spare, not measured.
Every string is escaped, and characters XML 1.0 forbids become U+FFFD: labels are data.
"""

from __future__ import annotations

import base64
import math
import re
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

FONT = "DejaVu Sans, Bitstream Vera Sans, Verdana, sans-serif"
INK = "#333333"
SPINE = "#999999"
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def escape(text: str) -> str:
    """``text`` for an SVG attribute or element: markup escaped, characters XML forbids replaced."""
    text = _NOT_XML.sub("\ufffd", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def text_width(text: str, size: float) -> float:
    """About how wide ``text`` is at ``size`` points (DejaVu Sans: 0.62 em a Latin character;
    CJK, emoji and other wide characters about 1 em)."""
    return size * sum(0.62 if ord(c) < 0x2E80 else 1.0 for c in text)


def ticks(top: float, count: int = 5) -> list[int]:
    """Whole-number ticks from 0 in a round step (1, 2, 2.5 or 5 x 10^k, at least 1) whose last is
    at least ``top``, about ``count`` steps: an axis of counts."""
    if top <= 0:
        return [0, 1]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = max(1, math.ceil(next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)))
    return [i * step for i in range(math.ceil(top / step) + 1)]


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _png(width: int, height: int, kind: int, chunks: bytes, rows: bytes) -> bytes:
    """A PNG of 8-bit samples: ``kind`` its colour type, ``chunks`` what goes before the data
    (a palette), ``rows`` the scanlines, each with its filter byte."""

    def chunk(name: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + name + data + struct.pack(">I", zlib.crc32(name + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, kind, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunks + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def png(pixels: list[list[str]]) -> bytes:
    """An RGB PNG of ``pixels``: rows of equal length of "#rrggbb" colours, top row first."""
    rows = b"".join(b"\x00" + bytes.fromhex("".join(color[1:] for color in row)) for row in pixels)  # filter 0
    return _png(len(pixels[0]), len(pixels), 2, b"", rows)


class Marks:
    """A ``width`` x ``height`` raster of vertical marks in one colour on a transparent ground,
    in bands of rows (a scatter plot's points, one band per category, as one image);
    :meth:`png` encodes it (a 2-colour palette PNG)."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self._bands: dict[tuple[int, int], bytearray] = {}  # (top, bottom) row -> the columns marked

    def bar(self, x: int, top: int, bottom: int, thickness: int = 1) -> None:
        """Mark columns ``x`` .. ``x + thickness - 1`` from row ``top`` to ``bottom`` (clipped).
        Marks with the same rows share one band: a mark costs a slice, not one per row."""
        left, right = max(x, 0), min(x + thickness, self.width)
        top, bottom = max(top, 0), min(bottom, self.height - 1)
        if left >= right or top > bottom:
            return
        band = self._bands.get((top, bottom))
        if band is None:
            band = self._bands[top, bottom] = bytearray(self.width)
        band[left:right] = b"\x01" * (right - left)

    def png(self, color: str) -> bytes:
        palette = struct.pack(">I", 6) + b"PLTE" + b"\xff\xff\xff" + bytes.fromhex(color[1:])
        palette += struct.pack(">I", zlib.crc32(palette[4:]))
        alpha = struct.pack(">I", 2) + b"tRNS\x00\xff"  # index 0 transparent, 1 opaque
        alpha += struct.pack(">I", zlib.crc32(alpha[4:]))
        stride = self.width + 1  # a filter byte (0: none) before each row
        raster = bytearray(stride * self.height)
        written = bytearray(self.height)
        for (top, bottom), band in self._bands.items():  # bands may overlap: their marks add up
            for row in range(top, bottom + 1):
                start = row * stride + 1
                if written[row]:
                    merged = bytes(a | b for a, b in zip(raster[start : start + self.width], band, strict=True))
                    raster[start : start + self.width] = merged
                else:
                    raster[start : start + self.width] = band
                    written[row] = 1
        return _png(self.width, self.height, 3, palette + alpha, bytes(raster))


class Canvas:
    """An SVG document of ``width`` x ``height`` points on a white ground, written element by
    element; :meth:`svg` returns its bytes.

    ``about`` becomes ``data-<key>="<value>"`` attributes of the root element: what the chart
    is of (its day, its N), for a client to check before it shows the chart.
    """

    def __init__(self, width: float, height: float, about: dict[str, str] | None = None) -> None:
        self.width, self.height = width, height
        marks = "".join(f' data-{key}="{escape(value)}"' for key, value in (about or {}).items())
        self._parts = [
            '<?xml version="1.0" encoding="utf-8" standalone="no"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{_n(width)}pt" '
            f'height="{_n(height)}pt" viewBox="0 0 {_n(width)} {_n(height)}" font-family="{FONT}"{marks}>\n'
            f'<rect x="0" y="0" width="{_n(width)}" height="{_n(height)}" fill="#ffffff"/>\n'
        ]

    def rect(self, x: float, y: float, width: float, height: float, fill: str, id: str = "", tip: str = "") -> None:
        """A filled rectangle (top left at x, y); ``id`` names it, ``tip`` is its tooltip."""
        attributes = f' id="{escape(id)}"' if id else ""
        size = f'width="{_n(max(width, 0))}" height="{_n(max(height, 0))}"'
        shape = f'<rect{attributes} x="{_n(x)}" y="{_n(y)}" {size} fill="{fill}"'
        self._parts.append(f"{shape}><title>{escape(tip)}</title></rect>\n" if tip else f"{shape}/>\n")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = SPINE, width: float = 0.8) -> None:
        self._parts.append(
            f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" '
            f'stroke="{stroke}" stroke-width="{_n(width)}"/>\n'
        )

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float = 10,
        anchor: str = "start",
        fill: str = INK,
        rotate: bool = False,
        middle: bool = False,
    ) -> None:
        """``text`` with its baseline at ``y`` (its middle when ``middle``), anchored at ``x``
        (start, middle or end); ``rotate``: read bottom to top, as a y axis label."""
        turn = f' transform="rotate(-90 {_n(x)} {_n(y)})"' if rotate else ""
        align = ' dominant-baseline="central"' if middle else ""
        self._parts.append(
            f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" text-anchor="{anchor}" fill="{fill}"{align}{turn}>'
            f"{escape(text)}</text>\n"
        )

    def gradient(self, id: str, colors: list[str], across: bool = False) -> None:
        """A gradient through ``colors``, bottom to top (left to right when ``across``), to fill
        a rect with ``url(#id)``."""
        stops = "".join(
            f'<stop offset="{_n(i / (len(colors) - 1))}" stop-color="{color}"/>' for i, color in enumerate(colors)
        )
        direction = 'x1="0" y1="0" x2="1" y2="0"' if across else 'x1="0" y1="1" x2="0" y2="0"'
        self._parts.append(f'<defs><linearGradient id="{escape(id)}" {direction}>{stops}</linearGradient></defs>\n')

    def image(
        self, x: float, y: float, width: float, height: float, image: bytes, id: str = "", opacity: float = 1
    ) -> None:
        """A PNG ``image`` stretched over the rectangle, each pixel a sharp block: a heatmap's
        cells or a scatter plot's points as one element, not one each."""
        attributes = (f' id="{escape(id)}"' if id else "") + (f' opacity="{_n(opacity)}"' if opacity != 1 else "")
        self._parts.append(
            f'<image{attributes} x="{_n(x)}" y="{_n(y)}" width="{_n(width)}" height="{_n(height)}" '
            f'preserveAspectRatio="none" image-rendering="optimizeSpeed" style="image-rendering:pixelated" '
            f'href="data:image/png;base64,{base64.b64encode(image).decode()}"/>\n'
        )

    @contextmanager
    def group(self, id: str) -> Iterator[None]:
        """Elements drawn inside the ``with`` block, grouped under ``id``."""
        self._parts.append(f'<g id="{escape(id)}">\n')
        yield
        self._parts.append("</g>\n")

    def svg(self) -> bytes:
        return ("".join(self._parts) + "</svg>\n").encode()
