"""What every static-level result on real SGLang must show (test_static_registry.py, test_static_public_configs.py).

Import it after the module-level ``meta_static.SKIP`` check, as the specparity imports there are.
"""

from __future__ import annotations

from typing import Any

from meta_static import INSTALLED

from specparity.idrules import sglang
from specparity.idrules.sglang import SGLangCapturePlan
from specparity.serving import ResolvedDeployment


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's own config: ``text_config`` for a multimodal wrapper, else the config itself."""
    text = cfg.get("text_config")
    return text if isinstance(text, dict) else cfg


def assert_resolved_as_planned(r: object, *, architecture: str, num_layers: int,
                               ids: list[int] | None) -> tuple[ResolvedDeployment, SGLangCapturePlan]:
    """``r`` resolved the target as written, and its captured layers are the conventions module's for the
    installed version; returns ``r`` and that plan."""
    assert isinstance(r, ResolvedDeployment), r
    assert r.target_architecture == architecture and r.num_layers == num_layers
    plan = sglang.capture_plan(ids, num_layers=num_layers, architecture=architecture, version=str(INSTALLED))
    assert r.layers_to_capture == plan.layers_to_capture
    assert r.served_sources == plan.served_sources
    return r, plan
