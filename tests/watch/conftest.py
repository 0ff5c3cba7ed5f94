"""The watch tier: `specparity watch` and the generated Prometheus rules against two real vLLM servers and a
real Prometheus, on the real model. Selected with ``-m watch_live`` (``make test-watch``); the default ``make test``
leaves this folder out, the same selection ``-m "not watch_live"`` makes."""

from __future__ import annotations

from pathlib import Path

import pytest


def _selected(config: pytest.Config) -> bool:
    expr = config.getoption("markexpr", "") or ""
    return "watch_live" in expr and "not watch_live" not in expr


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name.startswith("test_") and not _selected(config):
        return True
    return None
