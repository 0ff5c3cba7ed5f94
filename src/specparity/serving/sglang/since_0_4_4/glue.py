"""The pinned glue of the two family-B releases this family was written against (domain.md §6): everything that
differs between them is a field of :class:`~.run.LegacyGlue`. Other releases of the range get theirs by feature
detection from the nearer of the two (:func:`.adapter.detect_glue`). Runs only inside the child process.

0.4.10.post2:

- ``EagleDraftInput`` lives in ``speculative.eagle_utils`` (before the 0.5.3 move to ``eagle_info``).
- ``ScheduleBatch.init_new`` requires ``enable_custom_logit_processor`` (``managers/schedule_batch.py:913``).
- ``srt/utils.py:217`` reads ``torch._C._cpu._is_amx_tile_supported``, gone in torch 2.13: the torch-drift
  shim (``compat_stubs/torch_drift``) is applied on CPU before the first sglang import.
- The runner reads the draft ids at ``model_executor/model_runner.py:346-366``; a ``-1`` id crashes the
  llama target at ``models/llama.py:332``.

0.5.3:

- ``EagleDraftInput`` lives in ``speculative.eagle_info`` (moved there in 0.5.3).
- ``ScheduleBatch.init_new`` has no ``enable_custom_logit_processor`` (``managers/schedule_batch.py:974-984``).
- The runner reads the draft ids at ``model_executor/model_runner.py:450-470``; a ``-1`` id crashes the
  llama target at ``models/llama.py:340`` (``hidden_states + residual`` with ``residual = None``).
"""

from __future__ import annotations

from specparity.serving.sglang.since_0_4_4.run import LegacyGlue

GLUE_0_4_10 = LegacyGlue(
    version_label="0.4.10.post2",
    draft_input_module="sglang.srt.speculative.eagle_utils",
    batch_extra_kwargs={"enable_custom_logit_processor": False},
    torch_drift=True,
    ids_reader_cite="sglang 0.4.10.post2 model_executor/model_runner.py:346-366",
    boundary0_crash_cite="sglang 0.4.10.post2 models/llama.py:332",
    fc_build_cite="sglang 0.4.10.post2 models/llama_eagle3.py:124-128",
)

GLUE_0_5_3 = LegacyGlue(
    version_label="0.5.3",
    draft_input_module="sglang.srt.speculative.eagle_info",
    ids_reader_cite="sglang 0.5.3 model_executor/model_runner.py:450-470",
    boundary0_crash_cite="sglang 0.5.3 models/llama.py:340",
    fc_build_cite="sglang 0.5.3 models/llama_eagle3.py:134-138",
)
