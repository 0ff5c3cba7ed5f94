"""SGLang family A adapter, 0.4.4.post2-0.4.8 (domain.md §6, D1): static level only; configured ids are ignored.

These releases never read the draft's ``eagle_aux_hidden_state_layer_ids``: ``ModelRunner`` calls the
target's ``set_eagle3_layers_to_capture()`` with no argument (0.4.8 ``model_executor/model_runner.py:307``,
and ``cuda_graph_runner.py:298`` before capturing graphs), and the setter always captures the default
boundaries ``[2, L//2, L-3]`` = ``layer:{1, L//2-1, L-4}`` (0.4.8 ``models/llama.py:700-706``; 0.4.4.post2
``:627``). Resolution runs SGLang's own ServerArgs, ModelConfig, model-class selection and that setter
(:class:`~.since_0_4_4.adapter.FamilyBAdapter`'s static path; the setter's signature says it takes no ids), and adds a
``draft_ids_ignored`` finding naming the defaults. The capture level is not offered: its worker glue was never
run against a 0.4.x here, so it returns a typed failure instead of a capture nobody has checked.
Runs only inside the child process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specparity.checkpoint_files import fc_shape_from_checkpoint
from specparity.serving.child.worker_common import WorkerRequest
from specparity.serving.results import UNSUPPORTED_VERSION, CaptureResult, ResolvedDeployment, ServingFailure
from specparity.serving.sglang.adapter import Progress
from specparity.serving.sglang.setter_source import Citation, citation_text
from specparity.serving.sglang.since_0_4_4.adapter import FamilyBAdapter
from specparity.sources import layer

BIAS_CITE = ("sglang 0.4.8 models/llama_eagle3.py:109-112 builds fc = torch.nn.Linear(3*H_t, H_d) with torch's default "
             "bias=True whatever config.bias says; its load_weights (:183-193) fills fc.bias only from the "
             "checkpoint (domain.md D4)")
IGNORED_CITE = ("sglang 0.4.8 model_executor/model_runner.py:307 calls set_eagle3_layers_to_capture() with no ids; "
                "models/llama.py:700-706 captures [2, L//2, L-3] (0.4.4.post2 models/llama.py:627); domain.md D1")


def configured_ids(draft_hf_config: Any) -> tuple[int, ...] | None:
    """The ids the draft config asks for (nested or top level), which these releases never read."""
    ec = getattr(draft_hf_config, "eagle_config", None)
    ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
    ids = ids if ids is not None else getattr(draft_hf_config, "eagle_aux_hidden_state_layer_ids", None)
    try:
        return None if ids is None else tuple(int(x) for x in ids)
    except (TypeError, ValueError):
        return None


def ids_ignored_note(*, version: str, configured: tuple[int, ...] | None, num_layers: int,
                     setter: tuple[Citation, ...] = ()) -> tuple[str, str, str, str]:
    """The ``draft_ids_ignored`` finding: an error when the configured ids are not the defaults SGLang serves.

    ``setter``: the setters that ran (:mod:`.setter_source`); the cite then names the installed release's own
    setter, else 0.4.8's lines (:data:`IGNORED_CITE`).
    """
    default = (1, num_layers // 2 - 1, num_layers - 4)
    served = ", ".join(layer(i) for i in sorted(set(default)) if 0 <= i < num_layers)
    asked = "no ids" if configured is None else f"ids {list(configured)}"
    severity = "warning" if configured is None or tuple(configured) == default else "error"
    message = (f"sglang {version} ignores the draft's configured aux layer ids ({asked}): the target always "
               f"captures SGLang's defaults [1, L//2-1, L-4] = {list(default)} ({served}) for L={num_layers}")
    if severity == "error":
        message += "; upgrade to sglang >= 0.4.9 (ids honoured) or train on the defaults"
    cite = IGNORED_CITE if not setter else (
        f"sglang {version} {citation_text(setter[-1])} takes no ids; ModelRunner calls it with none "
        "(0.4.8 model_executor/model_runner.py:307); domain.md D1")
    return ("draft_ids_ignored", severity, message, cite)


def fc_bias_note(*, version: str, checkpoint_has_bias: bool | None) -> tuple[str, str, str, str] | None:
    """D4: these releases always build fc with a bias; without ``fc.bias`` in the checkpoint it stays random.

    ``checkpoint_has_bias`` None: no ``fc.weight`` in the checkpoint (the whole fc is random; reported elsewhere).
    """
    if checkpoint_has_bias is None or checkpoint_has_bias:
        return None
    return ("config_mismatch", "error",
            f"sglang {version} builds the drafter's fc with a bias whatever the config says, and the checkpoint "
            "has no fc.bias: the bias keeps its random initialisation, so every fc output is shifted; serve with "
            "sglang >= 0.4.9 (bias only if config.bias) or export the drafter with a trained fc.bias",
            BIAS_CITE)


class FamilyAAdapter(FamilyBAdapter):
    """Static resolution with SGLang's own objects, plus the ids-ignored finding; no capture level."""

    reads_ids_after_graphs = False  # no ids are read at all, so graphs and eager extend agree

    def resolve(self, request: WorkerRequest) -> ResolvedDeployment | ServingFailure:
        result = super().resolve(request)
        if not isinstance(result, ResolvedDeployment):
            return result
        from sglang.srt.configs.model_config import ModelConfig

        sa, _ = self._server_args(request, static=True)
        draft = ModelConfig.from_server_args(sa, model_path=sa.speculative_draft_model_path, is_draft_model=True)
        configured = configured_ids(draft.hf_config)
        note = ids_ignored_note(version=self.sglang_version, configured=configured, num_layers=result.num_layers,
                                setter=result.capture_rule_source)
        ckpt = fc_shape_from_checkpoint(Path(request.draft))
        bias = fc_bias_note(version=self.sglang_version, checkpoint_has_bias=None if ckpt is None else ckpt.bias)
        # no ids reach the target, so there is no fallback to explain (ids_fallback_reason stays None: the
        # default_ids_fallback finding's fix, a nested eagle_config, would change nothing here); the configured
        # ids travel as ignored_config_ids
        return dataclasses.replace(result, draft_config_ids=None, ids_fallback_reason=None, fc_bias=True,
                                   ids_read=False, ignored_config_ids=configured,
                                   adapter_notes=(*result.adapter_notes, note, *([bias] if bias else [])))

    def capture(self, request: WorkerRequest, *, progress: Progress) -> CaptureResult:
        return CaptureResult(None, None, None, (ServingFailure(UNSUPPORTED_VERSION, (
            f"sglang {self.sglang_version} (family A, 0.4.4.post2-0.4.8) is supported at the static level only: "
            "it ignores configured draft ids, and specparity's capture glue was never run on these releases; "
            "run `specparity gate --level static`")),))


def make_adapter(*, sglang_version: str, name: str) -> FamilyAAdapter:
    """Registry hook (``adapter.load_adapter``)."""
    return FamilyAAdapter(sglang_version=sglang_version, name=name)
