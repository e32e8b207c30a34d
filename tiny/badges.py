"""Download badges: the public cranlogs badges' SVG, label, colours and rounding, with a width
that fits the text and a label for screen readers (``role="img"``, ``aria-label``, ``<title>``)."""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

COLORS = {
    "brightgreen": "4c1",
    "green": "97CA00",
    "yellowgreen": "a4a61d",
    "yellow": "dfb317",
    "orange": "fe7d37",
    "red": "e05d44",
    "lightgrey": "9f9f9f",
    "blue": "007ec6",
}
DEFAULT_COLOR = "blue"
# The colour keywords of CSS Color 4, which SVG's fill takes as they are.
NAMED = frozenset(
    """aliceblue antiquewhite aqua aquamarine azure beige bisque black blanchedalmond blue blueviolet
    brown burlywood cadetblue chartreuse chocolate coral cornflowerblue cornsilk crimson cyan darkblue
    darkcyan darkgoldenrod darkgray darkgreen darkgrey darkkhaki darkmagenta darkolivegreen darkorange
    darkorchid darkred darksalmon darkseagreen darkslateblue darkslategray darkslategrey darkturquoise
    darkviolet deeppink deepskyblue dimgray dimgrey dodgerblue firebrick floralwhite forestgreen fuchsia
    gainsboro ghostwhite gold goldenrod gray green greenyellow grey honeydew hotpink indianred indigo
    ivory khaki lavender lavenderblush lawngreen lemonchiffon lightblue lightcoral lightcyan
    lightgoldenrodyellow lightgray lightgreen lightgrey lightpink lightsalmon lightseagreen lightskyblue
    lightslategray lightslategrey lightsteelblue lightyellow lime limegreen linen magenta maroon
    mediumaquamarine mediumblue mediumorchid mediumpurple mediumseagreen mediumslateblue
    mediumspringgreen mediumturquoise mediumvioletred midnightblue mintcream mistyrose moccasin
    navajowhite navy oldlace olive olivedrab orange orangered orchid palegoldenrod palegreen
    paleturquoise palevioletred papayawhip peachpuff peru pink plum powderblue purple rebeccapurple red
    rosybrown royalblue saddlebrown salmon sandybrown seagreen seashell sienna silver skyblue slateblue
    slategray slategrey snow springgreen steelblue tan teal thistle tomato turquoise violet wheat white
    whitesmoke yellow yellowgreen""".split()
)
_HEX = re.compile(r"#?([0-9a-fA-F]{3,4}|[0-9a-fA-F]{6}|[0-9a-fA-F]{8})\Z")
_LABEL_WIDTH = 70  # "downloads", as the public badges draw it
# Advance widths (px) of DejaVu Sans at 11 px, the badges' first font, for what a count can hold.
_WIDTHS = {**dict.fromkeys("0123456789", 7.0), "K": 7.6, "M": 9.5, ".": 3.5, "/": 3.7, " ": 3.5}
_WIDTHS.update(dict(zip("daymonthwek", (6.9, 6.8, 6.5, 10.7, 6.7, 7.0, 4.3, 7.0, 8.9, 6.7, 6.3), strict=True)))


def color(value: str | None) -> str:
    """The fill of a ``?color=`` value, as the public badges take it: a name of COLORS (their
    shades), any other colour name (NAMED), in any case, or a hex code of 3, 4, 6 or 8 digits,
    with or without its ``#`` (``%23ff69b4`` in a URL); ValueError else."""
    value = value or DEFAULT_COLOR
    name = value.lower() if value.isascii() else value
    if name in COLORS:
        return "#" + COLORS[name]
    if name in NAMED:
        return name
    hexcode = _HEX.match(value)
    if hexcode:
        return "#" + hexcode.group(1)
    raise ValueError(f"not a badge colour: {value!r} ({', '.join(COLORS)}, another CSS colour name, or a hex code)")


def pretty(count: int) -> str:
    """The public badges' rounding: from 1,000,000 tenths of millions (1.2M; 1M, not 1.0M, as
    their JavaScript prints it), from 10,000 thousands (23K; 999,999 is 1000K), else the number."""
    if count >= 1_000_000:
        tenths = _round_half_up(count / 100_000)
        return f"{tenths // 10}M" if tenths % 10 == 0 else f"{tenths / 10:.1f}M"
    if count >= 10_000:
        return f"{_round_half_up(count / 1000)}K"
    return str(count)


def _round_half_up(value: float) -> int:
    return int(value + 0.5)  # JavaScript's Math.round for positive numbers


def text(count: int, per: str) -> str:
    """The badge's value: the rounded count, then ``/month``, ``/week``, ``/day`` or nothing."""
    return pretty(count) + (f"/{per}" if per else "")


def svg(value: str, fill: str) -> bytes:
    """The badge: label "downloads" on grey, ``value`` on ``fill``, each part as wide as its
    text; screen readers read "CRAN downloads: ``value``" (its aria-label and its title)."""
    value_width = round(sum(_WIDTHS.get(char, 7.0) for char in value) + 10)
    width = _LABEL_WIDTH + value_width
    middle = _LABEL_WIDTH + value_width / 2
    label = escape(f"CRAN downloads: {value}", {'"': "&quot;"})
    value = escape(value)
    return f"""<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20" role="img" aria-label="{label}">
  <title>{label}</title>
  <linearGradient id="b" x2="0" y2="100%">
    <stop offset="0" stop-color="#bbb" stop-opacity=".1"/>
    <stop offset="1" stop-opacity=".1"/>
  </linearGradient>
  <mask id="a">
    <rect width="{width}" height="20" rx="3" fill="#fff"/>
  </mask>
  <g mask="url(#a)"><path fill="#555" d="M0 0h{_LABEL_WIDTH}v20H0z"/>
    <path fill="{fill}" d="M{_LABEL_WIDTH} 0h{value_width}v20H{_LABEL_WIDTH}z"/>
    <path fill="url(#b)" d="M0 0h{width}v20H0z"/>
  </g>
  <g fill="#fff" text-anchor="middle" font-family="DejaVu Sans,Verdana,Geneva,sans-serif" font-size="11">
    <text x="36" y="15" fill="#010101" fill-opacity=".3">downloads</text>
    <text x="36" y="14">downloads</text>
    <text x="{middle:g}" y="15" fill="#010101" fill-opacity=".3">{value}</text>
    <text x="{middle:g}" y="14">{value}</text>
  </g>
</svg>
""".encode()
