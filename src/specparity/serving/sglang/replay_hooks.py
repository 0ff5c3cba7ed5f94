"""Child-side drafter replay (the parent side is serving/drafter_replay.py): SGLang's real drafter on recorded vs
served fc inputs.

Runs inside the SGLang child after the fc capture, on the same live workers. Two more prefills of the
probes through ``EAGLEWorkerV2`` (the real target extend, then ``_draft_extend_for_prefill``, which runs
``LlamaForCausalLMEagle3``):

- ``served``: unchanged; whatever SGLang's target fed fc;
- ``recorded``: a forward pre-hook on the drafter's fc returns the recorded training rows instead (the
  hook may replace the args), so everything after fc is SGLang's own drafter code.

A forward hook on the drafter's ``LlamaModel`` keeps its per-token normed output (the extend runs every
prompt row even though the logits processor keeps only the last, CaptureHiddenMode.LAST); the draft
logits are then computed as SGLang's logits processor does (`# sglang 0.5.23
layers/logits_processor.py:1196-1200`: ``hidden.to(w.dtype) @ lm_head.weight.T``). Later draft positions
need SGLang's draft-decode path, whose CPU kernels do not exist (sglang-cpu.md §5 item 6); the parent
continues those on the training side.

Protocol: ``request.replay = {"inputs": <safetensors with fc/<i>>, "out": <safetensors to write>}``; the
child writes ``out`` (``served/<i>``, ``recorded/<i>``, optional ``hot_token_id``) and ``out + ".json"``
(status, hook calls, error text).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


class _DrafterTap:
    """fc pre-hook (optionally substituting) + LlamaModel forward hook (normed per-token output)."""

    def __init__(self, drafter: Any, substitute: torch.Tensor | None) -> None:
        self.substitute = substitute
        self.fc_calls = 0
        self.substituted = 0
        self.normed: list[torch.Tensor] = []
        self._handles = [drafter.model.fc.register_forward_pre_hook(self._on_fc),
                         drafter.model.register_forward_hook(self._on_model)]

    def _on_fc(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.fc_calls += 1
        if self.substitute is None:
            return None
        if tuple(args[0].shape) != tuple(self.substitute.shape):
            raise RuntimeError(f"fc input is {tuple(args[0].shape)}, recorded rows are "
                               f"{tuple(self.substitute.shape)}")
        self.substituted += 1
        return (self.substitute.to(device=args[0].device, dtype=args[0].dtype), *args[1:])

    def _on_model(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        # models/llama_eagle3.py:263-269 returns (hidden_states_to_logits, [aux]).
        self.normed.append(output[0].detach().clone())

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _logits(drafter: Any, normed: torch.Tensor) -> torch.Tensor:
    weight = drafter.lm_head.weight
    return torch.matmul(normed.to(weight.dtype), weight.T).to(torch.float32).cpu()


def run_replay(drafter: Any, replay: Mapping[str, str], *, probes: Sequence[Sequence[int]],
               prefill: Callable[[], object]) -> None:
    """Both replay passes; never raises (errors go to ``out + ".json"``).

    ``drafter`` is the live ``LlamaForCausalLMEagle3``; ``prefill()`` runs one spec prefill of ``probes``
    through the adapter's real workers (0.5.23: ``since_0_5_11.run.spec_prefill``).
    """
    out, status_path = Path(replay["out"]), Path(str(replay["out"]) + ".json")
    status: dict[str, Any] = {"ok": False, "passes": {}}
    try:
        lengths = [len(p) for p in probes]
        inputs = load_file(replay["inputs"])
        recorded = torch.cat([inputs[f"fc/{i}"] for i in range(len(lengths))])
        tensors: dict[str, torch.Tensor] = {}
        for tag, substitute in (("served", None), ("recorded", recorded)):
            tap = _DrafterTap(drafter, substitute)
            try:
                prefill()
            finally:
                tap.remove()
            status["passes"][tag] = {"fc_calls": tap.fc_calls, "substituted": tap.substituted,
                                     "model_calls": len(tap.normed)}
            if len(tap.normed) != 1 or tap.fc_calls != 1 or int(tap.normed[0].shape[0]) != sum(lengths):
                raise RuntimeError(f"{tag} pass: expected one drafter forward over {sum(lengths)} rows with one "
                                   f"fc call, saw {status['passes'][tag]} "
                                   f"rows {[int(t.shape[0]) for t in tap.normed]}")
            logits = _logits(drafter, tap.normed[0])
            for i, part in enumerate(torch.split(logits, lengths)):
                tensors[f"{tag}/{i}"] = part.contiguous()
        hot = getattr(drafter, "hot_token_id", None)
        if hot is not None:
            tensors["hot_token_id"] = hot.detach().to("cpu", torch.int64).contiguous()
        save_file(tensors, str(out))
        status["ok"] = True
    except Exception as exc:  # reported to the parent, which turns it into a typed failure
        status["error"] = f"{type(exc).__name__}: {exc}"
        status["traceback"] = traceback.format_exc()[-3000:]
    status_path.write_text(json.dumps(status))
