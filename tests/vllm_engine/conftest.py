"""Real-vLLM tests: run in the vllm-0.32 env (scripts/venv-engine.sh vllm 0.32), skipped from collection elsewhere.

The default suite runs in .venv (SGLang, no vLLM): there these modules are not collected at all, the same
selection `-m "not vllm"` makes. In .tox/vllm-0.32 they run with `pytest -m vllm tests/vllm_engine`.
The topology tier (test_vllm_topology.py: two Ray nodes, PP=2, TP=2 x PP=2) is collected only with
`-m topology` (`make test-topology`).
Every engine run here is one vLLM start in a child process (~15 s at TP=1 on 2 cores); the gate runs are
shared per module through fixtures so the env's test time stays within the CI budget.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def _vllm_installed() -> bool:
    # fixtures/vllm (the bundle) is on sys.path in some sessions and is then a namespace package named
    # vllm: it has no origin, the real vllm has its __init__.py.
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


if not _vllm_installed():
    collect_ignore_glob = ["test_*.py"]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The topology tier (test_vllm_topology.py) is collected only when selected: ``-m topology``."""
    if collection_path.name != "test_vllm_topology.py":
        return None
    expr = config.getoption("markexpr", "") or ""
    return not ("topology" in expr and "not topology" not in expr)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter whose vLLM serves: this one (the tests run inside the vllm env)."""
    return sys.executable
