"""The pytest plugin (``pytest -m parity``) against the real model, through pytester: a deploy repo's view.

One deployment table in a pyproject.toml, as a user writes it, names the real target and the trained drafter;
``pytest -m parity`` runs the real gate (SGLang 0.5.23, CPU) and every item passes with readable node ids. The
one-layer-late copy of the drafter fails its capture items, naming the off-by-one and the fix.
"""

from __future__ import annotations

import pytest
from tests.deploy_files import draft_with_ids, pyproject_with_deployments

from specparity.realmodel.fetch import RealModel
from specparity.realmodel.scenarios import CONTRACT, DRAFT

pytestmark = [pytest.mark.real_model, pytest.mark.sglang, pytest.mark.slow]


def test_parity_items_on_the_real_model(pytester: pytest.Pytester, real_model: RealModel) -> None:
    late = draft_with_ids(DRAFT, pytester.path / "draft-late", [2, 15, 27])
    pytester.makepyprojecttoml(pyproject_with_deployments({
        name: {"contract": CONTRACT, "target": real_model.fp32, "draft": draft, "level": "capture"}
        for name, draft in (("smollm2", DRAFT), ("smollm2-late", late))}))
    result = pytester.runpytest_subprocess("-m", "parity", "-v", timeout=1800)
    out = result.stdout.str()
    assert "parity::smollm2::static PASSED" in out and "parity::smollm2::capture[probe-0] PASSED" in out, out
    assert "parity::smollm2-late::capture[probe-0] FAILED" in out, out
    result.stdout.fnmatch_lines(["*off_by_one*", "*Fix: set eagle_config.eagle_aux_hidden_state_layer_ids = [[]1, 14, 26[]]*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1 and outcomes.get("passed", 0) >= 7, outcomes
