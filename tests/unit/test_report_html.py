"""The HTML report: self-contained, escaped, with a heatmap PNG we encode ourselves; rendered by Chromium."""

from __future__ import annotations

import base64
import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.report import png as pngmod
from specparity.report import render_html
from specparity.report.html import HEATMAP_CELL_HEIGHT, heatmap_cell_width
from specparity.verdict import ChunkReport, FixSuggestion, Heatmap, OutcomeSummary, Verdict

COLUMNS = ("embedding", *(f"layer:{i}" for i in range(8)))
EXPECTED = ("layer:1", "layer:3", "layer:5")
SERVED = ("embedding", "layer:1", "layer:3")


def heatmap_values() -> list[list[float]]:
    """Served chunks peak at embedding, layer:1, layer:3; recorded ones at layer:1, layer:3, layer:5."""
    rows = []
    for peak in [COLUMNS.index(s) for s in SERVED] + [COLUMNS.index(s) for s in EXPECTED]:
        rows.append([round(max(0.0, 1.0 - 0.22 * abs(c - peak)), 2) for c in range(len(COLUMNS))])
    rows[-1][-1] = float("nan")
    return rows


def failing_verdict(**kw: object) -> Verdict:
    base: dict[str, object] = dict(
        contract_name="tiny-llama-eagle3", contract_hash="ab" * 32, level="all", status="fail",
        sglang_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="fixtures/default/draft",
        expected_layout=EXPECTED, served_layout=SERVED,
        chunks=tuple(ChunkReport(i, e, s, cosine=0.3, max_abs_err=2.0, recorded=e, min_passing_atol=2.0)
                     for i, (e, s) in enumerate(zip(EXPECTED, SERVED, strict=True))),
        findings=(Finding(FindingKind.EXTRA_EMBEDDING, Severity.ERROR, "chunk 0 serves embedding", chunk=0),
                  Finding(FindingKind.MISSING_SOURCE, Severity.ERROR, "layer:5 is never served")),
        fix=FixSuggestion("set eagle_config.eagle_aux_hidden_state_layer_ids = [1, 3, 5] in d/config.json",
                          file="d/config.json", json_patch=({"op": "replace", "path": "/eagle_config/x", "value": [1, 3, 5]},)),
        outcome=OutcomeSummary((0.75, 0.57), (0.04, 0.0), 2.32, 1.04, None, "wiring"),
        heatmap=Heatmap([f"served {i}" for i in range(3)] + [f"recorded {i}" for i in range(3)], COLUMNS,
                        heatmap_values()),
        probes=tuple({"index": i, "tokens": 32, "status": "fail", "max_abs_err": 2.0} for i in range(2)),
        timings={"capture": 12.5},
    )
    base.update(kw)
    return Verdict(**base)  # type: ignore[arg-type]


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.imgs: dict[str, dict[str, str | None]] = {}
        self.tags: Counter[str] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        a = dict(attrs)
        if tag == "img" and a.get("id"):
            self.imgs[str(a["id"])] = a


def parse(html: str) -> _Collect:
    p = _Collect()
    p.feed(html)
    return p


def heatmap_bytes(html: str) -> bytes:
    src = parse(html).imgs["heatmap"]["src"]
    assert src is not None and src.startswith("data:image/png;base64,")
    return base64.b64decode(src.split(",", 1)[1], validate=True)


def test_self_contained_and_sections_present() -> None:
    html = render_html(failing_verdict())
    low = html.lower()
    for forbidden in ("http://", "https://", "<script", "<link", "@import", "url(", "<iframe"):
        assert forbidden not in low, forbidden
    p = parse(html)
    assert all(str(img["src"]).startswith("data:image/png;base64,") for img in p.imgs.values())
    for section in ('id="verdict"', 'id="fix"', 'id="json-patch"', 'id="chunk-table"', 'id="findings-table"',
                    'id="outcome-table"', 'id="heatmap"', 'id="colour-scale"', 'id="probe-table"'):
        assert section in html, section
    assert 'class="banner fail"' in html and "<h1>FAIL</h1>" in html
    assert "chunk 0 serves embedding" in html and "layer:5 is never served" in html
    assert "&quot;op&quot;: &quot;replace&quot;" in html


def test_all_text_is_escaped() -> None:
    evil = "<script>alert('x')</script>&"
    v = failing_verdict(
        contract_name=evil,
        findings=(Finding(FindingKind.SGLANG_ERROR, Severity.ERROR, f"raised {evil}", fix=evil),),
        heatmap=Heatmap([evil], [evil], [[0.5]]),
        resolved_spec_config={evil: evil},
        probes=({"index": 0, evil: evil},),
        timings={evil: 1.0},
    )
    html = render_html(v)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in html
    assert parse(html).tags["script"] == 0


def test_heatmap_png_geometry_and_cell_colours() -> None:
    v = failing_verdict()
    data = heatmap_bytes(render_html(v))
    assert data[:8] == pngmod.PNG_SIGNATURE
    cw, ch = heatmap_cell_width(len(COLUMNS)), HEATMAP_CELL_HEIGHT
    width, height, rows = pngmod.decode_png(data)
    assert (width, height) == (len(COLUMNS) * cw + 1, 6 * ch + 1)
    img = parse(render_html(v)).imgs["heatmap"]
    assert (img["width"], img["height"], img["alt"]) == (str(width), str(height), "chunk-by-boundary similarity heatmap")
    values = heatmap_values()
    for r, row in enumerate(values):
        best = max(range(len(row)), key=lambda c: -1.0 if row[c] != row[c] else row[c])
        for c, value in enumerate(row):
            cx, cy = c * cw + cw // 2, r * ch + ch // 2  # cell centre
            assert rows[cy][cx] == pngmod.colour_for(value), (r, c)
            corner = rows[r * ch + 1][c * cw + 1]
            assert corner == (pngmod.BEST_COLOUR if c == best else pngmod.colour_for(value)), (r, c)
        assert rows[r * ch][0] == pngmod.GRID_COLOUR
    assert rows[5 * ch + ch // 2][(len(COLUMNS) - 1) * cw + cw // 2] == pngmod.NAN_COLOUR


def test_no_heatmap_says_why() -> None:
    html = render_html(failing_verdict(heatmap=None, level="static"))
    assert 'id="heatmap"' not in html
    assert "No heatmap: no tensors were captured at level static." in html
    errored = render_html(failing_verdict(heatmap=None, status="error"))
    assert "No heatmap: SGLang failed before any tensor was captured." in errored


def test_pass_report_has_no_fix_section() -> None:
    v = failing_verdict(status="pass", served_layout=EXPECTED, findings=(), fix=None, outcome=None, chunks=())
    html = render_html(v)
    assert 'class="banner pass"' in html and 'id="fix"' not in html and "Findings (0)" in html


def test_colour_scale_endpoints() -> None:
    assert pngmod.colour_for(0.0) == (68, 1, 84)
    assert pngmod.colour_for(-0.5) == (68, 1, 84)
    assert pngmod.colour_for(1.0) == (253, 231, 37)
    assert pngmod.colour_for(7.0) == (253, 231, 37)
    assert pngmod.colour_for(float("nan")) == pngmod.NAN_COLOUR


def _filtered_png(rows: list[list[tuple[int, int, int]]], filters: list[int]) -> bytes:
    """A PNG whose scanlines use the given filter types (PNG spec §9.2), to exercise the decoder."""
    def paeth(a: int, b: int, c: int) -> int:
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        return a if pa <= pb and pa <= pc else (b if pb <= pc else c)

    raw, prev = bytearray(), bytes(len(rows[0]) * 3)
    for row, f in zip(rows, filters, strict=True):
        line = bytes(v for px in row for v in px)
        out = bytearray([f])
        for i, x in enumerate(line):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], (prev[i - 3] if i >= 3 else 0)
            pred = (0, a, b, (a + b) >> 1, paeth(a, b, c))[f]
            out.append((x - pred) & 0xFF)
        raw += out
        prev = line

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 2, 0, 0, 0)
    return pngmod.PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b"")


_pixel = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), width=st.integers(1, 7), height=st.integers(1, 6))
def test_png_round_trip_any_image_and_any_filters(data: st.DataObject, width: int, height: int) -> None:
    rows = [data.draw(st.lists(_pixel, min_size=width, max_size=width)) for _ in range(height)]
    assert pngmod.decode_png(pngmod.encode_png(rows)) == (width, height, rows)
    filters = data.draw(st.lists(st.integers(0, 4), min_size=height, max_size=height))
    assert pngmod.decode_png(_filtered_png(rows, filters)) == (width, height, rows)


def test_png_corruption_is_detected() -> None:
    data = bytearray(pngmod.encode_png([[(1, 2, 3)]]))
    data[-20] ^= 0xFF  # inside IDAT
    with pytest.raises(ValueError, match="CRC"):
        pngmod.decode_png(bytes(data))
    with pytest.raises(ValueError, match="not a PNG"):
        pngmod.png_size(b"GIF89a" + bytes(30))


# --- rendered by a real browser ------------------------------------------------------------------

def _chromium() -> str:
    exe = "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is required in CI to render the HTML report (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium); in CI (CI set) this fails")
    return exe


def _chromium_run(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'profile'}", "--window-size=1200,1600", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_chromium_renders_the_report_with_its_heatmap(tmp_path: Path) -> None:
    exe = _chromium()
    v = failing_verdict()
    html = render_html(v)
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    shot = tmp_path / "shot.png"

    dom = _chromium_run(exe, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    dumped = parse(dom.stdout)
    assert dumped.imgs["heatmap"]["src"] == parse(html).imgs["heatmap"]["src"]  # the browser kept it whole
    assert dumped.tags["script"] == 0

    res = _chromium_run(exe, tmp_path, f"--screenshot={shot}", page.as_uri())
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    width, height, pixels = pngmod.decode_png(shot.read_bytes())
    assert (width, height) == (1200, 1600)
    seen = Counter(px for row in pixels for px in row)
    assert seen[(0xB3, 0x26, 0x1E)] > 1200 * 40  # the red FAIL banner

    # Every colour of the heatmap image appears in the screenshot, about as often (the page shows the
    # image at its natural size, pixelated, so each cell keeps its exact colour).
    _, _, hm = pngmod.decode_png(heatmap_bytes(html))
    expected = Counter(px for row in hm for px in row if px != pngmod.GRID_COLOUR)
    assert len(expected) >= 6  # five cosine levels, grey NaN and the red best-match frames
    for colour, count in expected.items():
        assert seen[colour] >= 0.9 * count, (colour, seen[colour], count)


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.data: list[str] = []

    def handle_data(self, data: str) -> None:
        self.data.append(data)


@settings(max_examples=40, deadline=None)
@given(text=st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40))
def test_any_text_round_trips_as_text_and_never_adds_markup(text: str) -> None:
    def page(t: str) -> str:
        return render_html(failing_verdict(
            findings=(Finding(FindingKind.LAYOUT_MISMATCH, Severity.ERROR, t, fix=t),),
            heatmap=Heatmap([t], [t], [[0.5]])))

    html, plain = page(text), page("plain")
    assert parse(html).tags == parse(plain).tags
    p = _Text()
    p.feed(html)
    assert text in p.data  # the findings table cell holds exactly the message


def test_missing_chromium_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        _chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        _chromium()
