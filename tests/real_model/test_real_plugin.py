"""The pytest plugin (``pytest -m parity``) against the real model, through pytester: a deploy repo's view.

One deployment table in a pyproject.toml, as a user writes it, names the real target and the trained drafter;
``pytest -m parity`` runs the real gate (SGLang 0.5.23, CPU) and every item passes with readable node ids. The
one-layer-late copy of the drafter fails its capture items, naming the off-by-one and the fix.
"""

from __future__ import annotations

import json
import shutil

import pytest

from specparity.realmodel.fetch import RealModel
from specparity.realmodel.scenarios import CONTRACT, DRAFT

pytestmark = [pytest.mark.real_model, pytest.mark.sglang, pytest.mark.slow]


def test_parity_items_on_the_real_model(pytester: pytest.Pytester, real_model: RealModel) -> None:
    late = pytester.path / "draft-late"
    shutil.copytree(DRAFT, late)
    cfg = json.loads((late / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]
    (late / "config.json").write_text(json.dumps(cfg))
    pytester.makepyprojecttoml(f'''
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider"

[tool.specparity.deployments.smollm2]
contract = "{CONTRACT}"
target = "{real_model.fp32}"
draft = "{DRAFT}"
level = "capture"

[tool.specparity.deployments.smollm2-late]
contract = "{CONTRACT}"
target = "{real_model.fp32}"
draft = "{late}"
level = "capture"
''')
    result = pytester.runpytest_subprocess("-m", "parity", "-v", timeout=1800)
    out = result.stdout.str()
    assert "parity::smollm2::static PASSED" in out and "parity::smollm2::capture[probe-0] PASSED" in out, out
    assert "parity::smollm2-late::capture[probe-0] FAILED" in out, out
    result.stdout.fnmatch_lines(["*off_by_one*", "*Fix: set eagle_config.eagle_aux_hidden_state_layer_ids = [[]1, 14, 26[]]*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1 and outcomes.get("passed", 0) >= 7, outcomes
