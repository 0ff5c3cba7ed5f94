"""The fault tier: real gate runs signalled at named points, bad inputs, reports on file systems
that refuse them, a launched server and the pytest plugin, each checked for its exit code, for nothing left running,
no temporary directory left, inputs unchanged and reports whole or absent (tests/faults/fault_runs.py).

Selected with ``-m faults`` (``make test-faults``; .ci/run runs it after ``make test``); the default ``make test``
leaves these modules out, as it does the real-model and topology tiers.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def _selected(config: pytest.Config) -> bool:
    expr = config.getoption("markexpr", "") or ""
    return "faults" in expr and "not faults" not in expr


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collected only when selected."""
    if not collection_path.name.startswith("test_"):
        return None
    return not _selected(config)


# Seconds each test took on 2 loaded cores (load average about 10): the tier runs on two workers one test at a time
# (--maxschedchunk 1), the longest first, so the last to start are the shortest.
COST_S = {
    "test_signals_on_a_warm_child": 188,
    "test_signals_on_a_cold_child": 130,
    "test_sigkill_while_the_launched_server_is_up_leaves_nothing": 116,
    "test_the_plugin_interrupted_while_its_gate_runs[SIGTERM-capture]": 40,
    "test_an_engine_that_cannot_be_imported_is_exit_3": 35,
    "test_bad_input_is_exit_2_and_nothing_starts": 29,
    "test_a_full_disk_while_writing_is_exit_3_and_leaves_no_partial_file": 25,
    "test_the_plugin_interrupted_while_its_gate_runs[SIGINT-engine_import]": 18,
    "test_an_html_report_on_a_read_only_file_system_is_exit_2_before_the_engine": 13,
    "test_the_plugin_report_on_a_read_only_disk_stops_the_session_before_any_gate_run": 4,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fault tier's tests longest first (:data:`COST_S`); every other item keeps its place after them."""
    if _selected(config):
        items.sort(key=lambda item: -COST_S.get(item.name, 0) if item.get_closest_marker("faults") else 0)
