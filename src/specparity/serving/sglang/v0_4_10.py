"""SGLang 0.4.10.post2 adapter (family B, before the worker-v2 API; domain.md §6): version glue only.

All behaviour lives in :mod:`.legacy` / :mod:`.legacy_run`, shared with 0.5.3. Runs only inside the
child process. What is specific to 0.4.10.post2:

- ``EagleDraftInput`` lives in ``speculative.eagle_utils`` (before the 0.5.3 move to ``eagle_info``).
- ``ScheduleBatch.init_new`` requires ``enable_custom_logit_processor`` (``managers/schedule_batch.py:913``).
- ``srt/utils.py:217`` reads ``torch._C._cpu._is_amx_tile_supported``, gone in torch 2.13: the torch-drift
  shim (``compat_stubs/torch_drift``) is applied on CPU before the first sglang import.
- The runner reads the draft ids at ``model_executor/model_runner.py:346-366``; a ``-1`` id crashes the
  llama target at ``models/llama.py:332``.
"""

from __future__ import annotations

from specparity.serving.sglang.legacy import LegacyAdapter
from specparity.serving.sglang.legacy_run import LegacyGlue

GLUE = LegacyGlue(
    version_label="0.4.10.post2",
    draft_input_module="sglang.srt.speculative.eagle_utils",
    batch_extra_kwargs={"enable_custom_logit_processor": False},
    torch_drift=True,
    ids_reader_cite="sglang 0.4.10.post2 model_executor/model_runner.py:346-366",
    boundary0_crash_cite="sglang 0.4.10.post2 models/llama.py:332",
    fc_build_cite="sglang 0.4.10.post2 models/llama_eagle3.py:124-128",
)


def make_adapter(*, sglang_version: str, name: str) -> LegacyAdapter:
    """Registry hook (``adapter.load_adapter``)."""
    return LegacyAdapter(sglang_version=sglang_version, name=name, glue=GLUE)
