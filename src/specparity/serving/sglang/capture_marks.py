"""Which boundaries a target's own layer loop captures, set for the layer atlas and restored after (no sglang import).

SGLang's layer loops capture in one of two styles: by membership of the layer index in ``model.layers_to_capture``
(llama-style) or by a mark SGLang's setter puts on each layer (:data:`CAPTURE_MARK`). The atlas needs every
boundary in one forward and none in the next; :func:`aux_capture` sets both styles and restores them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# Classes whose layer loop captures a layer's input when the layer carries this attribute, not when its index is in
# ``layers_to_capture`` (0.5.23 models/qwen2_moe.py:1153-1156 and 1196-1202; also qwen3_moe, qwen3_next, qwen3_5,
# bailing_moe, lfm2, minimax_m3). Their setter only ever sets it to True.
CAPTURE_MARK = "_is_layer_to_capture"
_ABSENT = object()


@contextmanager
def aux_capture(target: Any) -> Iterator[Any]:
    """Set which boundaries the target's own layer loop captures, restored on exit: ``set_(boundaries, on)``.

    Both capture styles are set: ``model.layers_to_capture`` (llama-style loops test membership) and, where
    SGLang's setter marked the layers (:data:`CAPTURE_MARK`: the EAGLE-3 setup always marks at least one), each
    layer's mark, cleared on the layers outside ``boundaries``. Without the marks, a capture list of every
    boundary captured only the deployment's own layers there, and an empty list still captured them, so the
    model handed the logits processor a (hidden, aux) pair (a false "TypeError ... index" on Qwen3-MoE).
    """
    model = target.model
    layers = list(getattr(model, "layers", ()))  # every SGLang model has them; a unit test's fake may not
    marked = any(CAPTURE_MARK in vars(m) for m in layers)
    saved = (list(model.layers_to_capture), target.capture_aux_hidden_states,
             [vars(m).get(CAPTURE_MARK, _ABSENT) for m in layers])

    def set_(boundaries: Sequence[int], on: bool) -> None:
        model.layers_to_capture = list(boundaries)
        target.capture_aux_hidden_states = on
        if marked:
            wanted = set(boundaries)
            for i, m in enumerate(layers):
                setattr(m, CAPTURE_MARK, i in wanted)

    try:
        yield set_
    finally:
        model.layers_to_capture, target.capture_aux_hidden_states = saved[0], saved[1]
        for m, mark in zip(layers, saved[2], strict=True):
            if mark is _ABSENT:
                vars(m).pop(CAPTURE_MARK, None)
            else:
                setattr(m, CAPTURE_MARK, mark)
