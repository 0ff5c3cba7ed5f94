"""pytest plugin: the ``parity`` marker, options and fixtures (thin over :mod:`specparity.gate`)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "parity: train/serve parity checks of an EAGLE-3 drafter against its contract "
        "(run with `pytest -m parity --parity-contract FILE --parity-target DIR --parity-draft DIR`)",
    )
