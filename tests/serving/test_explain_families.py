"""``specparity explain`` on the bundled default, on every SGLang family: exit code, ids line and the quoted rule.

One explain run per module (the fixture); each test reads one property of it. What is expected comes from the
installed SGLang: its adapter notes (an ``error`` one is exit 1, as the gate fails on it), its conventions plan,
and its own setter's file, lines and text read with ``inspect`` (setter_sources.py), so the same tests hold on
0.4.8 (family A: ids ignored, D1), 0.4.10.post2-0.5.10 (B), 0.5.14 (C), 0.5.20 (D) and 0.5.23 (E).
Their SGLang-free halves (explain_resolved on a built record) are in tests/unit/test_explain_unit.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from setter_sources import cited, installed_setters
from version_facts import SGLANG_VERSION

from specparity.cli import main
from specparity.idrules import sglang
from specparity.idrules.sglang import SGLangCapturePlan

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "fixtures" / "default"
Run = tuple[int, str, dict[str, object]]


def _plan(ids: list[int]) -> SGLangCapturePlan:
    return sglang.capture_plan(ids, num_layers=8, architecture="LlamaForCausalLM", version=str(SGLANG_VERSION))


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("explain") / "explain.json"
    r = CliRunner().invoke(main, ["explain", "--target", str(DEFAULT / "target"), "--draft", str(DEFAULT / "draft"),
                                  "--json", str(out)])
    return r.exit_code, r.output, json.loads(out.read_text()) if out.is_file() else {}


def _line(text: str, head: str) -> str:
    [line] = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(head)]
    return line


@pytest.mark.sglang
def test_bundled_default_serves_what_this_version_makes_of_ids_1_3_5(bundled: Run) -> None:
    """layer:1, layer:3, layer:5 where the ids are read; family A (D1) serves its default layer:1, layer:3,
    layer:4 and the explanation says the ids were ignored, naming the defaults."""
    _code, text, data = bundled
    plan = _plan([1, 3, 5])
    assert data["served_sources"] == list(plan.served_sources), text
    assert ", ".join(plan.served_sources) in text
    fc = data["fc_checkpoint"]
    assert isinstance(fc, dict) and (fc["in_features"], fc["out_features"]) == (192, 64)
    notes = {n["kind"]: n["severity"] for n in data["adapter_notes"]}  # type: ignore[attr-defined]
    if plan.used_default:
        assert plan.served_sources == ("layer:1", "layer:3", "layer:4")
        assert "draft_ids_ignored" in text and "[1, 3, 4]" in text
        assert notes.get("draft_ids_ignored") == "error", notes
    else:
        assert plan.served_sources == ("layer:1", "layer:3", "layer:5") and data["draft_ids"] == [1, 3, 5]
        assert fc["bias"] is False


@pytest.mark.sglang
def test_exit_code_follows_the_error_lines_it_prints(bundled: Run) -> None:
    """An ``error`` adapter note (family A's draft_ids_ignored and config_mismatch, family B's
    cuda_graph_ids_hazard) is the deployment not serving what its draft config says: exit 1, as the gate's static
    verdict (test_explain.py::test_from_config_contract_gets_the_static_verdict_and_says_it_is_assumed); never an
    error line with exit 0."""
    code, text, data = bundled
    errors = [n["kind"] for n in data["adapter_notes"] if n["severity"] == "error"]  # type: ignore[attr-defined]
    printed = [ln for ln in text.splitlines() if ln.strip().startswith("error ")]
    assert len(printed) == len(errors), text
    if _plan([1, 3, 5]).used_default:  # family A: both D1 and D4 hit the bundle (trained on 1,3,5, no fc.bias)
        assert set(errors) == {"draft_ids_ignored", "config_mismatch"}, errors
    if not errors:
        assert code == 0, text
        return
    assert code == 1 and data["exit_code"] == 1, text
    summary = text.splitlines()[0]
    assert "does not serve what the draft config says" in summary and all(k in summary for k in errors), summary


@pytest.mark.sglang
def test_ids_line_names_the_configured_ids_and_whether_this_release_reads_them(bundled: Run) -> None:
    _code, text, data = bundled
    line = _line(text, "ids ")
    assert "None" not in line and "[1, 3, 5]" in line, line
    assert data["draft_ids"] == [1, 3, 5]
    if _plan([1, 3, 5]).used_default:  # family A never reads them (its setter takes none)
        assert "ignored" in line and f"sglang {SGLANG_VERSION} reads no draft ids" in line, line
        assert data["ids_read"] is False and "ignored" in str(data["ids_source"]), data
    else:
        assert data["ids_read"] is True and "eagle_config.eagle_aux_hidden_state_layer_ids" in line, line


@pytest.fixture(scope="module")
def llama_setter() -> dict[str, object]:
    [setter] = installed_setters(("sglang.srt.models.llama", "LlamaForCausalLM"))
    return setter


@pytest.mark.sglang
def test_rule_cites_the_installed_releases_setter(bundled: Run, llama_setter: dict[str, object]) -> None:
    """The rule line quotes this release's own file and lines (0.4.8 models/llama.py:700-706, 0.5.23 :929-941, ...),
    never 0.5.23's for every release."""
    _code, text, _data = bundled
    rule = _line(text, "rule ")
    assert f"sglang {SGLANG_VERSION} {cited(llama_setter)}" in rule, (rule, llama_setter)
    assert "as read in sglang 0.5.23" not in rule, rule


@pytest.mark.sglang
def test_json_carries_the_rules_file_lines_and_code(bundled: Run, llama_setter: dict[str, object]) -> None:
    _code, _text, data = bundled
    convention = data["convention"]
    assert isinstance(convention, dict) and convention["cited_release"] == SGLANG_VERSION, convention
    assert convention["sources"] == [{**llama_setter, "role": "rule"}], convention["sources"]
    assert "def set_eagle3_layers_to_capture" in str(llama_setter["code"])
