"""`make demo`, the README's first command, as a test: the main job on the bundled tiny models (SGLang 0.5.23, the
release .venv serves), every scenario ending as the demo expects, and the summary table saying each outcome's cause."""

from __future__ import annotations

from pathlib import Path

import pytest
from version_facts import SGLANG_VERSION

pytestmark = pytest.mark.sglang


@pytest.mark.skipif(SGLANG_VERSION != "0.5.23", reason="the demo's scenarios end as written on SGLang 0.5.23 (.venv)")
def test_make_demo_ends_as_expected_and_says_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specparity.demo import main

    assert main(["--reports", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "did not end as expected" not in out
    header = next(line for line in out.splitlines() if "scenario" in line and "verdict" in line)
    assert "cause" in header
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario-1", "scenario-2", "scenario-3"]
