"""The HTML report: self-contained, escaped, with the matplotlib heatmap (labelled, colour bar, marks)
embedded as a PNG and written as SVG; rendered by Chromium. Images are read with Pillow."""

from __future__ import annotations

import base64
import io
import itertools
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib import colormaps
from PIL import Image

from specparity.compare.findings import Finding, FindingKind, Severity
from specparity.report import render_html, write_reports
from specparity.report.heatmap import (
    COLOUR_BAR_LABEL,
    X_LABEL,
    Y_LABEL,
    heatmap_figure,
    heatmap_svg,
    labelled_columns,
    marks,
)
from specparity.verdict import ChunkReport, FixSuggestion, Heatmap, OutcomeSummary, Verdict

WINDOW = (1280, 1400)
VIRIDIS_0, VIRIDIS_1 = (tuple(int(x) for x in colormaps["viridis"](v, bytes=True)[:3]) for v in (0.0, 1.0))
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
        engine_version="0.5.23", target_architecture="LlamaForCausalLM", draft_path="fixtures/default/draft",
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
                    'id="outcome-table"', 'id="heatmap"', 'id="probe-table"', 'id="environment-table"'):
        assert section in html, section
    assert 'class="banner fail"' in html and "<h1>FAIL</h1>" in html
    assert "chunk 0 serves embedding" in html and "layer:5 is never served" in html
    assert "&#34;op&#34;: &#34;replace&#34;" in html  # markupsafe's escapes


def test_all_text_is_escaped() -> None:
    evil = "<script>alert('x')</script>&"
    v = failing_verdict(
        contract_name=evil,
        findings=(Finding(FindingKind.ENGINE_ERROR, Severity.ERROR, f"raised {evil}", fix=evil),),
        heatmap=Heatmap([evil], [evil], [[0.5]]),
        resolved_spec_config={evil: evil},
        probes=({"index": 0, evil: evil},),
        timings={evil: 1.0},
    )
    html = render_html(v)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;" in html
    assert parse(html).tags["script"] == 0


def _figure_facts(heatmap: Heatmap, expected: tuple[str, ...] = EXPECTED) -> dict[str, object]:
    fig = heatmap_figure(heatmap, expected)
    ax, bar_ax = fig.axes[0], fig.axes[1]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return {
        "fig": fig, "ax": ax,
        "xticks": [t.get_text() for t in ax.get_xticklabels()],
        "yticks": [t.get_text() for t in ax.get_yticklabels()],
        "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "bar_label": bar_ax.get_ylabel(),
        "gids": {str(p.get_gid()) for p in ax.patches},
        "x_extents": [t.get_window_extent(renderer) for t in ax.get_xticklabels()],
    }


def test_heatmap_figure_is_labelled_with_colour_bar_and_marks() -> None:
    facts = _figure_facts(failing_verdict().heatmap)  # type: ignore[arg-type]
    assert facts["xticks"] == list(COLUMNS)
    assert facts["yticks"] == [f"served {i}" for i in range(3)] + [f"recorded {i}" for i in range(3)]
    assert (facts["xlabel"], facts["ylabel"], facts["bar_label"]) == (X_LABEL, Y_LABEL, COLOUR_BAR_LABEL)
    # best match per row: the peak of heatmap_values(); expected: the contract's source for that chunk
    peaks = [COLUMNS.index(s) for s in SERVED] + [COLUMNS.index(s) for s in EXPECTED]
    wanted = [COLUMNS.index(s) for s in EXPECTED] * 2
    assert facts["gids"] == {f"best-{r}-{c}" for r, c in enumerate(peaks)} | {
        f"expected-{r}-{c}" for r, c in enumerate(wanted)}
    legend = facts["ax"].get_legend()  # type: ignore[attr-defined]
    assert [t.get_text() for t in legend.get_texts()] == ["best match", "expected (contract)", "not a number"]


def test_marks_skip_nan_and_unknown_sources() -> None:
    hm = Heatmap(["served 0", "served 1", "odd row"], ["embedding", "layer:0"],
                 [[float("nan"), 0.2], [float("nan"), float("nan")], [0.9, 0.1]])
    m = marks(hm, ["layer:0", "layer:7"])
    assert m.best == (1, None, 0)
    assert m.expected == (1, None, None)  # layer:7 is not a column; "odd row" names no chunk


def atlas_62() -> Heatmap:
    """A 62-boundary atlas (embedding + 61 layers, a Kimi-sized target): chunks peak at layer:2/29/59,
    served chunk 0 at the embedding."""
    cols = ["embedding", *(f"layer:{i}" for i in range(61))]
    peaks = [cols.index(s) for s in ("embedding", "layer:29", "layer:59", "layer:2", "layer:29", "layer:59")]
    values = [[round(max(0.0, 1.0 - 0.08 * abs(c - p)), 3) for c in range(len(cols))] for p in peaks]
    values[5][-1] = float("nan")
    return Heatmap([f"served {i}" for i in range(3)] + [f"recorded {i}" for i in range(3)], cols, values)


EXPECTED_62 = ("layer:2", "layer:29", "layer:59")


def test_62_boundaries_each_have_a_label_that_overlaps_no_other() -> None:
    hm = atlas_62()
    facts = _figure_facts(hm, EXPECTED_62)
    assert facts["xticks"] == list(hm.columns)
    boxes = facts["x_extents"]
    for left, right in itertools.pairwise(boxes):  # type: ignore[call-overload]
        assert left.x1 <= right.x0 + 0.5, (left, right)  # vertical labels side by side, not on top
    fig = facts["fig"]
    assert fig.get_size_inches()[0] * fig.dpi >= 62 * 12  # at least 12 px per boundary


def test_very_deep_targets_label_every_nth_plus_the_marked_columns() -> None:
    assert labelled_columns(62) == list(range(62))
    shown = labelled_columns(300, [7, None, 151])
    assert {0, 7, 151, 299} <= set(shown) and len(shown) < 160


def reds(colours: Counter[tuple[int, int, int]]) -> int:
    """Pixels of the best-match frame red (report.heatmap.BEST_COLOUR), anti-aliased edges included."""
    return sum(n for (r, g, b), n in colours.items() if r >= 200 and g <= 60 and b <= 60)


def test_png_in_the_html_is_the_drawn_heatmap() -> None:
    v = failing_verdict()
    html = render_html(v)
    data = heatmap_bytes(html)
    with Image.open(io.BytesIO(data)) as im:
        assert im.format == "PNG"
        size = im.size
        colours = Counter(im.convert("RGB").get_flattened_data())
    img = parse(html).imgs["heatmap"]
    assert (img["width"], img["height"]) == (str(size[0]), str(size[1]))
    assert (img["data-rows"], img["data-columns"]) == ("6", str(len(COLUMNS)))
    assert str(img["alt"]).startswith("chunk-by-boundary similarity heatmap")
    assert colours[VIRIDIS_1] > 100 and colours[VIRIDIS_0] > 100  # cells at cosine 1 and at 0
    assert reds(colours) > 6 * 40  # the best-match frames: six cells framed
    assert colours[(0xA0, 0xA0, 0xA0)] > 100  # the NaN cell


def test_report_dir_gets_an_svg_heatmap_with_text_labels(tmp_path: Path) -> None:
    paths = write_reports(failing_verdict(heatmap=atlas_62()), tmp_path)
    assert tmp_path / "heatmap.svg" in paths
    svg = (tmp_path / "heatmap.svg").read_text()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    texts = "".join(root.itertext())
    for label in ("embedding", "layer:29", "layer:60", "served 0", "recorded 2", X_LABEL, COLOUR_BAR_LABEL):
        assert label in texts, label
    assert write_reports(failing_verdict(heatmap=atlas_62()), tmp_path / "again")[-1].name == "junit.xml"
    assert (tmp_path / "again" / "heatmap.svg").read_bytes() == (tmp_path / "heatmap.svg").read_bytes()
    assert not (tmp_path / "none" / "heatmap.svg").exists()
    write_reports(failing_verdict(heatmap=None), tmp_path / "none")
    assert not (tmp_path / "none" / "heatmap.svg").exists()


def test_svg_escapes_hostile_labels() -> None:
    evil = "<script>alert('x')</script>&"
    svg = heatmap_svg(Heatmap([evil], [evil], [[0.5]]), [evil])
    root = ET.fromstring(svg)  # still well-formed XML
    assert not any(el.tag.endswith("script") for el in root.iter())
    assert evil in "".join(root.itertext())


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
           f"--user-data-dir={tmp / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
           "--force-device-scale-factor=1", "--force-color-profile=srgb", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_chromium_shows_the_labelled_heatmap_of_a_62_boundary_atlas(tmp_path: Path) -> None:
    exe = _chromium()
    v = failing_verdict(heatmap=atlas_62(), expected_layout=EXPECTED_62,
                        chunks=tuple(ChunkReport(i, e, s, cosine=0.3, max_abs_err=2.0, recorded=e)
                                     for i, (e, s) in enumerate(zip(EXPECTED_62, ("embedding", "layer:29", "layer:59"),
                                                                    strict=True))))
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
    if os.environ.get("SPECPARITY_SCREENSHOT_DIR"):  # to look at it: the file the test saw
        shutil.copy(shot, Path(os.environ["SPECPARITY_SCREENSHOT_DIR"]) / "report-62.png")
    with Image.open(shot) as im:
        assert im.size == WINDOW
        seen = Counter(im.convert("RGB").get_flattened_data())
    with Image.open(io.BytesIO(heatmap_bytes(html))) as hm:
        assert hm.size[0] <= WINDOW[0] - 40  # shown at its natural size, labels and all
        drawn = Counter(hm.convert("RGB").get_flattened_data())
    assert seen[(0xB3, 0x26, 0x1E)] > WINDOW[0] * 40  # the red FAIL banner
    # the heatmap's main colours (viridis ends, best-match red, NaN grey, and the dark label text)
    # appear in the screenshot about as often as in the image: the page shows the whole image unscaled
    for colour, count in drawn.most_common(12):
        if colour != (255, 255, 255):
            assert seen[colour] >= 0.9 * count, (colour, seen[colour], count)
    assert drawn[VIRIDIS_1] > 100 and reds(seen) >= reds(drawn) > 6 * 40


def _tiny_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="PNG")
    return buf.getvalue()


TINY_PNG = _tiny_png()


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

    with mock.patch("specparity.report.html.heatmap_png", lambda *_a: TINY_PNG):  # the text is in the table
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


def _env_table(html: str) -> dict[str, str]:
    section = html.split('id="environment-table"', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td>(.*?)</td>", section)
    return dict(zip(cells[::2], cells[1::2], strict=True))


def test_environment_says_what_the_evidence_carries_and_nothing_else() -> None:
    bare = _env_table(render_html(failing_verdict()))
    assert bare["engine"] == "sglang" and bare["engine version"] == "0.5.23"
    for label in ("engine install path", "torch", "transformers", "device", "stand-ins active"):
        assert bare[label] == "not recorded", label  # never guessed from the gate's own interpreter
    full = failing_verdict(environment={
        "python": "/opt/serve/bin/python", "sglang": "0.5.3", "sglang_path": "/opt/serve/lib/sglang",
        "torch": "2.13.0+cpu", "transformers": "4.57.1", "device": "cpu", "tp": "2"},
        stand_ins=("sgl_kernel: copy_all_layer_kv_cache_cpu x3",))
    env = _env_table(render_html(full))
    assert env == {"engine": "sglang", "engine version": "0.5.3", "engine install path": "/opt/serve/lib/sglang",
                   "interpreter": "/opt/serve/bin/python", "torch": "2.13.0+cpu", "torch install path": "not recorded",
                   "transformers": "4.57.1", "device": "cpu",
                   "stand-ins active": "sgl_kernel: copy_all_layer_kv_cache_cpu x3", "tp": "2"}
    none = failing_verdict(environment={"device": "cpu"})
    assert _env_table(render_html(none))["stand-ins active"] == "none"  # recorded, and empty
