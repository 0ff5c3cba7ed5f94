"""Our own test wiring only (pytester); no plugin logic lives here."""

# pytester's in-process runs restore sys.modules when they end, so a library first imported inside one is
# dropped and imported a second time by a later test. matplotlib then meets objects of its first copy
# (TypeError: Invalid arguments to set_clip_path, of type Rectangle and NoneType) and every HTML report of
# the session fails. Import what the heatmap uses once, before any pytester run. The plugin's own start-up
# test runs pytest in a subprocess, where this conftest is not loaded.
import os

import matplotlib.backends.backend_agg
import matplotlib.colors
import matplotlib.figure
import matplotlib.lines
import matplotlib.patches  # noqa: F401
import pytest

# Real-engine children start warm: forked from a zygote that imported the engine once per interpreter
# (src/specparity/serving/child/warm.py), instead of a new interpreter paying ~20 CPU-s (SGLang) or ~16 (vLLM) of
# imports per child. tests/serving/test_warm_start_sglang.py and tests/vllm_engine/test_vllm_warm_start.py show a
# warm capture equals a cold one; SPECPARITY_WARM_START=0 runs the whole suite cold.
os.environ.setdefault("SPECPARITY_WARM_START", "1")

# The property tests check rules that hold for all inputs; how long one example takes is not one of them. Hypothesis's
# 200 ms deadline per example fails a slow one on a loaded 2-core machine (CI runs two lanes of engines beside them).
try:
    from hypothesis import settings
except ImportError:  # an engine env without hypothesis collects no property test
    pass
else:
    settings.register_profile("specparity", deadline=None)
    settings.load_profile("specparity")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The bundle tier (``-m bundle``, ``make test-bundle``) runs only when selected, as the topology and
    real-model tiers do: it regenerates the whole default bundle (fixtures/make_default.py)."""
    expr = config.getoption("markexpr", "") or ""
    if "bundle" in expr and "not bundle" not in expr:
        return
    dropped = [item for item in items if item.get_closest_marker("bundle") is not None]
    if dropped:
        items[:] = [item for item in items if item.get_closest_marker("bundle") is None]
        config.hook.pytest_deselected(items=dropped)
