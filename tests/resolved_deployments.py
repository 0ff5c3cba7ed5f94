"""A hand-built ``ResolvedDeployment`` of a tiny bundled Llama + EAGLE-3 pair, for tests of what follows a resolve.

Imported as ``tests.resolved_deployments`` (pytest puts the checkout's root, the root conftest.py's folder, on
sys.path), so that every test folder can use it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specparity.serving import ResolvedDeployment, SpecSettings


def tiny_deployment(bundle: Path, **fields: Any) -> ResolvedDeployment:
    """The bundle's target (8 layers, H=64, vocab 512) and drafter (ids 1, 3, 5; fc 192 -> 64) in float32 on CPU,
    as SGLang 0.5.23 resolves them (layers 2, 4, 6 captured: layer:1, 3, 5 served); ``fields`` replace any field."""
    spec = SpecSettings(3, 1, 4)
    base = ResolvedDeployment(
        engine_version="0.5.23", adapter="sglang-0.5.23", target_path=str(bundle / "target"),
        draft_path=str(bundle / "draft"), device="cpu", target_architecture="LlamaForCausalLM", num_layers=8,
        target_hidden_size=64, target_vocab_size=512, target_dtype="float32",
        draft_architecture="LlamaForCausalLMEagle3", draft_hidden_size=64, draft_vocab_size=256,
        requested_spec=spec, resolved_spec=spec, spec_warnings=(), draft_config_ids=(1, 3, 5),
        ids_fallback_reason=None, layers_to_capture=(2, 4, 6), served_sources=("layer:1", "layer:3", "layer:5"),
        fc_in_features=192, fc_out_features=64, fc_bias=False, num_aux_hidden_states=3, fc_applied=True,
        norm_before_fc=False, fc_norm=False, norm_output=False, fc_bias_in_config=False, server_args={}, timings={})
    return dataclasses.replace(base, **fields)
