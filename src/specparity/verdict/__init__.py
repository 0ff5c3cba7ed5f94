"""The gate's verdict: the one object every face renders (``record.py``: :class:`Verdict` and its parts, ``to_dict``
the documented JSON) and the rules that decide it from the findings (``rules.py``: each finding's check, the status,
the exit code, each pytest item's findings). A gate run becomes a verdict in ``gate_verdict.py``; the faces are
``report/``'s.
"""

from specparity.verdict.record import (
    ChunkReport,
    FixSuggestion,
    Heatmap,
    Level,
    OutcomeSummary,
    Status,
    Verdict,
    verdict_from_dict,
)

__all__ = ["ChunkReport", "FixSuggestion", "Heatmap", "Level", "OutcomeSummary", "Status", "Verdict",
           "verdict_from_dict"]
