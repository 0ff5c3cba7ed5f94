"""SGLang 0.5.3 adapter (family B, before the worker-v2 API; domain.md §6): version glue only.

All behaviour lives in :mod:`.legacy` / :mod:`.legacy_run`, shared with 0.4.10.post2. Runs only inside
the child process. What is specific to 0.5.3:

- ``EagleDraftInput`` lives in ``speculative.eagle_info`` (moved there in 0.5.3).
- ``ScheduleBatch.init_new`` has no ``enable_custom_logit_processor`` (``managers/schedule_batch.py:974-984``).
- The runner reads the draft ids at ``model_executor/model_runner.py:450-470``; a ``-1`` id crashes the
  llama target at ``models/llama.py:340`` (``hidden_states + residual`` with ``residual = None``).
"""

from __future__ import annotations

from specparity.serving.sglang.legacy import LegacyAdapter
from specparity.serving.sglang.legacy_run import LegacyGlue

GLUE = LegacyGlue(
    version_label="0.5.3",
    draft_input_module="sglang.srt.speculative.eagle_info",
    ids_reader_cite="sglang 0.5.3 model_executor/model_runner.py:450-470",
    boundary0_crash_cite="sglang 0.5.3 models/llama.py:340",
    fc_build_cite="sglang 0.5.3 models/llama_eagle3.py:134-138",
)


def make_adapter(*, sglang_version: str, name: str) -> LegacyAdapter:
    """Registry hook (``adapter.load_adapter``)."""
    return LegacyAdapter(sglang_version=sglang_version, name=name, glue=GLUE)
