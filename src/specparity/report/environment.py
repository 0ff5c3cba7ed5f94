"""The environment a verdict was reached in, as report rows: engine, version and install path, torch,
transformers, device, and the stand-ins that were active.

The values come from the evidence the engine's child process returned, carried by the verdict's JSON
form under ``"environment"`` (keys below); ``sglang_version`` fills in the engine version where the
verdict has no environment yet. A value the evidence does not carry is shown as ``not recorded``,
never guessed from the gate's own interpreter (with ``--python`` the child runs another one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specparity.verdict import Verdict

NOT_RECORDED = "not recorded"
# (key in verdict.to_dict()["environment"], label)
ENVIRONMENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("engine", "engine"),
    ("engine_version", "engine version"),
    ("engine_path", "engine install path"),
    ("python", "interpreter"),
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("device", "device"),
    ("stand_ins", "stand-ins active"),
)


def environment(verdict: Verdict) -> dict[str, Any]:
    """The verdict's environment mapping (empty when the evidence carries none)."""
    env = verdict.to_dict().get("environment")
    out = dict(env) if isinstance(env, Mapping) else {}
    if verdict.sglang_version and not out.get("engine_version"):
        out.setdefault("engine", "sglang")
        out["engine_version"] = verdict.sglang_version
    return out


def _text(value: Any) -> str:
    if value is None or value == "":
        return NOT_RECORDED
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ", ".join(_text(v) for v in value) or "none"
    return str(value)


def environment_rows(verdict: Verdict) -> list[tuple[str, str]]:
    """``(label, value)`` for every environment field, then any extra keys the evidence carries."""
    env = environment(verdict)
    rows = [(label, _text(env.get(key))) for key, label in ENVIRONMENT_FIELDS]
    known = {key for key, _ in ENVIRONMENT_FIELDS}
    rows += [(str(k), _text(v)) for k, v in env.items() if k not in known]
    return rows
