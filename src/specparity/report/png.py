"""A minimal PNG encoder (and decoder, for tests) built on zlib + struct, and the heatmap colour map.

The HTML report embeds its heatmap as a PNG data URI so that the report is one self-contained file
with no matplotlib/PIL dependency. Only what the report needs is supported: 8-bit truecolour (RGB)
images, encoded with filter type 0; the decoder also reads RGBA and all five filter types (PNG spec
§9.2) so that tests can read screenshots written by other encoders.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

RGB = tuple[int, int, int]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Viridis anchor colours (matplotlib's viridis at 0, 1/4, 1/2, 3/4, 1): perceptually ordered and
# readable by colour-blind users; cosine 0 (or below) is dark purple, cosine 1 is yellow.
_ANCHORS: tuple[RGB, ...] = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
NAN_COLOUR: RGB = (160, 160, 160)
GRID_COLOUR: RGB = (255, 255, 255)
BEST_COLOUR: RGB = (255, 0, 0)


def colour_for(value: float, *, low: float = 0.0, high: float = 1.0) -> RGB:
    """Colour of ``value`` on the viridis scale from ``low`` to ``high`` (clamped); NaN is grey."""
    if math.isnan(value):
        return NAN_COLOUR
    span = high - low
    t = 0.0 if span <= 0 else (value - low) / span
    t = min(1.0, max(0.0, t))
    pos = t * (len(_ANCHORS) - 1)
    i = min(int(pos), len(_ANCHORS) - 2)
    f = pos - i
    a, b = _ANCHORS[i], _ANCHORS[i + 1]
    return (round(a[0] + (b[0] - a[0]) * f), round(a[1] + (b[1] - a[1]) * f), round(a[2] + (b[2] - a[2]) * f))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(pixels: Sequence[Sequence[RGB]]) -> bytes:
    """Encode rows of RGB pixels (all rows the same, non-zero length) as a PNG file."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if width == 0 or height == 0:
        raise ValueError("a PNG needs at least one pixel")
    raw = bytearray()
    for y, row in enumerate(pixels):
        if len(row) != width:
            raise ValueError(f"row {y} has {len(row)} pixels, expected {width}")
        raw.append(0)  # filter type 0 (None) for every scanline
        for r, g, b in row:
            raw += bytes((r, g, b))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit truecolour, no interlace
    return PNG_SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + _chunk(b"IEND", b"")


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR; raises ValueError when ``data`` is not a PNG."""
    if data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> tuple[int, int, list[list[RGB]]]:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG to ``(width, height, rows of RGB)``.

    Checks every chunk CRC. Pure Python: meant for tests and small images.
    """
    width, height = png_size(data)
    pos, idat, channels = 8, bytearray(), 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad CRC in {kind.decode('latin-1')} chunk")
        if kind == b"IHDR":
            depth, ctype, _, _, interlace = body[8:13]
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: bit depth {depth}, colour type {ctype}, interlace {interlace}")
            channels = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    raw = zlib.decompress(bytes(idat))
    stride = width * channels
    prev = bytearray(stride)
    rows: list[list[RGB]] = []
    for y in range(height):
        start = y * (stride + 1)
        ftype, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if ftype == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif ftype == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif ftype == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                upleft = prev[i - channels] if i >= channels else 0
                line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
        elif ftype != 0:
            raise ValueError(f"unknown PNG filter type {ftype} on row {y}")
        rows.append([(line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels)])
        prev = line
    return width, height, rows


def heatmap_pixels(
    values: Sequence[Sequence[float]], *, cell_width: int, cell_height: int, mark_best: bool = True
) -> list[list[RGB]]:
    """Pixels of a cell grid: one ``cell_width`` x ``cell_height`` block per value, 1-px white grid.

    With ``mark_best`` the highest finite value of each row gets a 2-px red frame (the attributed
    boundary of that chunk).
    """
    if not values or not values[0]:
        raise ValueError("a heatmap needs at least one row and one column")
    ncols = len(values[0])
    if any(len(r) != ncols for r in values):
        raise ValueError("heatmap rows differ in length")
    width, height = ncols * cell_width + 1, len(values) * cell_height + 1
    pixels = [[GRID_COLOUR] * width for _ in range(height)]
    for r, row in enumerate(values):
        finite = [v for v in row if not math.isnan(v)]
        best = row.index(max(finite)) if (mark_best and finite) else -1
        for c, value in enumerate(row):
            colour = colour_for(value)
            x0, y0 = c * cell_width + 1, r * cell_height + 1
            for y in range(y0, y0 + cell_height - 1):
                line = pixels[y]
                for x in range(x0, x0 + cell_width - 1):
                    edge = min(x - x0, y - y0, x0 + cell_width - 2 - x, y0 + cell_height - 2 - y)
                    line[x] = BEST_COLOUR if (c == best and edge < 2) else colour
    return pixels


def colour_scale_pixels(*, width: int, height: int) -> list[list[RGB]]:
    """A horizontal colour bar from cosine 0 (left) to 1 (right)."""
    row = [colour_for(x / max(1, width - 1)) for x in range(width)]
    return [list(row) for _ in range(height)]
