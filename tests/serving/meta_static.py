"""In-process static resolution on SGLang 0.5.23's meta device, for test_static_registry.py and
test_static_public_configs.py (the static path keeps one one-rank world per process,
since_0_5_11.static.init_single_rank).

Import it before anything that imports sglang: where another SGLang is installed, :data:`SKIP` says why the
module skips itself (those versions have their own family tests); otherwise it sets what the serving child sets
before its first sglang import.
"""

from __future__ import annotations

import os
from typing import Any

from version_facts import SGLANG_VERSION as INSTALLED

from specparity.serving.sglang.adapter import AdapterEntry, select_adapter
from specparity.serving.sglang.worker import install_kernel_stub_if_needed

ENTRY = select_adapter(INSTALLED) if INSTALLED is not None else None
SKIP = (f"the meta-device static level is 0.5.23's; sglang {INSTALLED} is covered by its own family tests"
        if isinstance(ENTRY, AdapterEntry) and INSTALLED != "0.5.23" else None)
if SKIP is None:
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # before the first sglang import, as the serving child does
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    install_kernel_stub_if_needed("cpu")


def make_0523_adapter() -> Any:
    """The 0.5.23 adapter the serving child would build for the installed SGLang."""
    from specparity.serving.sglang.since_0_5_11.core import make_adapter

    return make_adapter(sglang_version=str(INSTALLED), name=ENTRY.name if isinstance(ENTRY, AdapterEntry) else "?")
