"""SGLang families C, D and E, 0.5.11-0.5.23 (domain.md §6): the worker-v2 adapter, differences by feature detection.

These releases share the shape the 0.5.23 adapter drives (``TpModelWorker`` + ``EAGLEWorkerV2``, ids set
before CUDA graphs); :mod:`.v0_5_23` holds the behaviour and detects what moved inside the range:

- spec-arg resolution: ``arg_groups`` + ``resolved_view`` (>= 0.5.19) vs the rewritten ServerArgs attribute;
- ``EagleDraftInput``: ``speculative.eagle_info`` (always here; ``eagle_utils`` only before 0.5.3).

Runs only inside the child process.
"""

from __future__ import annotations

from specparity.serving.sglang.v0_5_23 import Adapter


def make_adapter(*, sglang_version: str, name: str) -> Adapter:
    """Registry hook (``adapter.load_adapter``)."""
    return Adapter(sglang_version=sglang_version, name=name)
