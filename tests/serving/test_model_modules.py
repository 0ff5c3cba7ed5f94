"""The static level imports only the target's and draft's SGLang model modules, and gives what the full registry gives.

Each resolution runs in its own cold child (serving.resolve_deployment), as the CLI runs it, with the cache of
SGLang's architecture -> module map in a fresh XDG_CACHE_HOME: the first resolution imports the full registry
and records the map, the second imports two modules, and a map that names the wrong module is caught.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from version_facts import SGLANG_VERSION

from specparity.serving import ResolvedDeployment
from specparity.serving.sglang.client import resolve_deployment

pytestmark = pytest.mark.sglang
REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "fixtures" / "default"

if SGLANG_VERSION != "0.5.23":
    pytest.skip(f"the limited registry is the 0.5.23 static path's; sglang {SGLANG_VERSION} imports it whole",
                allow_module_level=True)


def _resolve() -> ResolvedDeployment:
    r = resolve_deployment(DEFAULT / "target", DEFAULT / "draft", device="cpu")
    assert isinstance(r, ResolvedDeployment), r
    return r


def test_limited_registry_gives_the_full_registrys_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SGLANG_DISABLED_MODEL_ARCHS", raising=False)
    # cold children, as the CLI starts them: a warm-start zygote (serving/child/warm.py) has the whole registry imported
    monkeypatch.setenv("SPECPARITY_WARM_START", "0")
    full = _resolve()
    assert full.timings["registry_limited"] == 0.0
    (cache,) = (tmp_path / "specparity").glob("sglang-model-modules-*.json")
    where = json.loads(cache.read_text())
    assert where["LlamaForCausalLM"] == "llama" and where["LlamaForCausalLMEagle3"] == "llama_eagle3"

    limited = _resolve()
    assert limited.timings["registry_limited"] == 1.0
    assert (limited.target_architecture, limited.draft_model_class, limited.layers_to_capture, limited.served_sources,
            limited.draft_fc_module) == (full.target_architecture, full.draft_model_class, full.layers_to_capture,
                                         full.served_sources, full.draft_fc_module)

    # A map naming the wrong module: the class SGLang's limited registry gives is not from it, so the model is
    # built again from the full registry and the answer is the same
    cache.write_text(json.dumps({**where, "LlamaForCausalLM": "qwen2"}))
    healed = _resolve()
    assert healed.timings["registry_limited"] == 0.0
    assert (healed.target_architecture, healed.served_sources) == (full.target_architecture, full.served_sources)
