"""Typed findings: the stable vocabulary every check reports in.

A :class:`Finding` is one named problem (or observation) with a severity, a message in canonical
source names, optional chunk index, structured details and an optional one-line fix. The terminal,
JSON and HTML reports all render the same objects.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class FindingKind(str, enum.Enum):
    """Stable identifiers of what went wrong. Values never change once released."""

    # layout of the fc input
    EXTRA_EMBEDDING = "extra_embedding"
    MISSING_SOURCE = "missing_source"
    OFF_BY_ONE = "off_by_one"
    # the draft config's ids mean other layers on the serving engine than under the training tool's convention
    ENGINE_CONVENTION_MISMATCH = "engine_convention_mismatch"
    ORDER_MISMATCH = "order_mismatch"
    LAYOUT_MISMATCH = "layout_mismatch"
    # the layers the engine resolved (static, explain) are not the layers its captured fc input is
    STATIC_CAPTURE_DISAGREEMENT = "static_capture_disagreement"
    # how SGLang resolved the deployment
    DEFAULT_IDS_FALLBACK = "default_ids_fallback"
    WIDTH_MISMATCH = "width_mismatch"
    CAPTURE_COUNT_SHORT = "capture_count_short"
    FC_NOT_CALLED = "fc_not_called"
    # a rank of the served world (TP x PP) that should have reported its evidence and did not
    RANK_MISSING = "rank_missing"
    SPEC_CONFIG_REWRITTEN = "spec_config_rewritten"
    VOCAB_MAP_MISMATCH = "vocab_map_mismatch"
    CONFIG_MISMATCH = "config_mismatch"
    # what the SGLang version family does (serving/sglang/families.py)
    UNTESTED_VERSION = "untested_version"
    DRAFT_IDS_IGNORED = "draft_ids_ignored"
    CUDA_GRAPH_IDS_HAZARD = "cuda_graph_ids_hazard"
    # tensor content
    NORM_MISMATCH = "norm_mismatch"
    POSITION_SHIFT = "position_shift"
    NONFINITE = "nonfinite"
    NUMERIC_DRIFT = "numeric_drift"
    # the training side
    CONTRACT_SELF_INCONSISTENT = "contract_self_inconsistent"
    RESOLUTION_NOTE = "resolution_note"  # info: how the static level resolved (hardware check skipped, ...)
    LAYOUT_ASSUMED = "layout_assumed"  # info: a contract from configs alone, its layout derived, not recorded
    # the deployed target against the one training recorded (contract fingerprints, or other weights)
    TARGET_MISMATCH = "target_mismatch"
    # the engine loaded the target only partly: parameters its load_weights never filled, checkpoint tensors it
    # skipped (serving/sglang/load_check.py); the checkpoint may be the very one training used
    TARGET_PARTLY_LOADED = "target_partly_loaded"
    TOKENIZER_MISMATCH = "tokenizer_mismatch"
    CHAT_TEMPLATE_MISMATCH = "chat_template_mismatch"
    # outcome: drafter acceptance on recorded vs served fc inputs (specparity.replay)
    ACCEPTANCE_COLLAPSE = "acceptance_collapse"
    ACCEPTANCE_BELOW_CONTRACT = "acceptance_below_contract"
    MODEL_QUALITY = "model_quality"  # below the floor on its own inputs, with no expectation in the contract
    ACCEPTANCE_INCONCLUSIVE = "acceptance_inconclusive"  # too few scored tokens to clear or confirm a collapse
    # the server's own acceptance (replay/server_acceptance.py): below the contract's band; or not measurable (no
    # drafts, too few to tell, other clients' requests in a global counter's window): the machine's, exit 3
    SERVED_ACCEPTANCE_COLLAPSE = "served_acceptance_collapse"
    SERVER_ACCEPTANCE_UNMEASURED = "server_acceptance_unmeasured"
    # the serving engine (SGLang or vLLM) raised, refused or died: details name ``engine`` and ``version``,
    # and ``cause`` says whose fault it is (``deployment``: exit 1; otherwise the machine's: exit 3)
    ENGINE_ERROR = "engine_error"
    # read from reports written before engine_error existed (docs/report-format.md, changelog); never emitted
    SGLANG_ERROR = "sglang_error"
    TIMEOUT = "timeout"
    # a check that could not run on this deployment: a warning naming what was not checked and why
    CHECK_SKIPPED = "check_skipped"
    # the deploy command as given (--launch; serving/command/findings.py): an EAGLE-3 drafter served under the
    # EAGLE-1/2 algorithm (no aux hidden states reach fc); a served target other than the one the drafter or the
    # contract names; vLLM's speculators form, where the target comes from the drafter's config
    EAGLE3_SERVED_AS_EAGLE = "eagle3_served_as_eagle"
    SERVED_TARGET_UNEXPECTED = "served_target_unexpected"
    TARGET_FROM_DRAFT_CONFIG = "target_from_draft_config"
    # the deployment names no speculative algorithm and specparity chose the one the drafter's family is served with
    # (specparity.drafters: a DFlash drafter under DFLASH / method dflash); the drafter's family differs from the one
    # the contract records
    SPECULATIVE_ALGORITHM_ASSUMED = "speculative_algorithm_assumed"
    DRAFTER_FAMILY_MISMATCH = "drafter_family_mismatch"


# Separates an engine worker's own exception, put first in a failure's message, from the engine's generic report
# after it (serving/vllm/root_cause.py); the exit code is decided on the text before it (verdict/rules.py failure_cause).
ENGINE_THEN = "; vLLM's engine then reported: "


class Severity(str, enum.Enum):
    """``error`` fails the gate, ``warning`` is shown and may be promoted, ``info`` is context."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


ENGINE_LABELS = {"sglang": "SGLang", "vllm": "vLLM"}  # engine names (``details["engine"]``) as reports spell them


def engine_label(engine: str | None) -> str:
    """``SGLang``, ``vLLM``: an engine name as reports spell it (``the serving engine`` when unknown)."""
    return ENGINE_LABELS.get(engine or "", engine or "the serving engine")


ENVIRONMENT_KINDS = frozenset({FindingKind.ENGINE_ERROR, FindingKind.SGLANG_ERROR, FindingKind.TIMEOUT,
                               FindingKind.SERVER_ACCEPTANCE_UNMEASURED})


def _jsonable(value: object) -> object:
    """Details as plain JSON: tuples become lists, enums their value, non-finite floats strings."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    return value


@dataclass(frozen=True)
class Finding:
    """One problem found by a check.

    ``message`` names sources only in canonical vocabulary and carries the numbers that justify it;
    ``fix`` is a one-line remedy when one is known.
    """

    kind: FindingKind
    severity: Severity
    message: str
    chunk: int | None = None
    details: Mapping[str, object] = field(default_factory=dict, hash=False)
    fix: str | None = None

    def __post_init__(self) -> None:
        # A private plain-dict copy: callers cannot change a finding through their own mapping, and it pickles
        # (pytest-xdist and multiprocessing ship findings between processes).
        object.__setattr__(self, "details", dict(self.details))

    @property
    def is_failure(self) -> bool:
        """True for error severity."""
        return self.severity is Severity.ERROR

    def to_dict(self) -> dict[str, object]:
        """Plain-JSON view (stable key order)."""
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "message": self.message,
            "chunk": self.chunk,
            "details": _jsonable(self.details),
            "fix": self.fix,
        }


def worst_severity(findings: list[Finding] | tuple[Finding, ...]) -> Severity | None:
    """The most severe severity present, or None when there are no findings."""
    for severity in (Severity.ERROR, Severity.WARNING, Severity.INFO):
        if any(f.severity is severity for f in findings):
            return severity
    return None


def is_environmental(f: Finding) -> bool:
    """Whether an error finding says the check could not run here (exit 3), not that the deployment is wrong."""
    if f.kind not in ENVIRONMENT_KINDS:
        return False
    return f.details.get("cause") != "deployment"


def status_of(findings: Iterable[Finding]) -> str:
    """``pass`` (no error), ``error`` (only environmental errors) or ``fail``."""
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if not errors:
        return "pass"
    return "error" if all(is_environmental(f) for f in errors) else "fail"


def adapter_findings(dep: Any) -> list[Finding]:
    """What the engine's version family knows about a resolved deployment (``ResolvedDeployment.adapter_notes``)
    as findings: the gate reports them, and ``specparity explain`` exits by the same decision."""
    return [Finding(FindingKind(kind), Severity(severity), message,
                    # "sglang_version": engine_version's deprecated alias (as in the report's top level), removed in 0.2.0
                    details={"engine_version": dep.engine_version, "sglang_version": dep.engine_version,
                             "adapter": dep.adapter, "cite": cite})
            for kind, severity, message, cite in dep.adapter_notes]
