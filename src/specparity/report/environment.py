"""The environment a verdict was reached in, as report rows: engine, version and install path, torch,
transformers, device, and the stand-ins that were active.

The values come from the evidence the engine's child process returned (``Verdict.environment``,
``Verdict.stand_ins``), read through the verdict's JSON form so that keys added later show up too;
``engine_version`` fills in the engine version where the child reported nothing. A value the
evidence does not carry is shown as ``not recorded``, never guessed from the gate's own interpreter
(with ``--python`` the child runs another one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specparity.verdict import Verdict

NOT_RECORDED = "not recorded"
# label -> keys to try in the verdict's JSON ``environment`` (the child's, serving/sglang/worker.py
# child_environment: python, sglang, sglang_path, torch, torch_path, transformers, device); engine-neutral
# names (engine, engine_version, engine_path) first, for engines other than SGLang
ENVIRONMENT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine", ("engine",)),
    ("engine version", ("engine_version", "sglang")),
    ("engine install path", ("engine_path", "sglang_path")),
    ("interpreter", ("python",)),
    ("torch", ("torch",)),
    ("torch install path", ("torch_path",)),
    ("transformers", ("transformers",)),
    ("device", ("device",)),
)
STAND_INS_LABEL = "stand-ins active"


def environment(verdict: Verdict) -> dict[str, Any]:
    """The verdict's environment mapping plus ``stand_ins`` (empty when the evidence carries none)."""
    d = verdict.to_dict()
    env = d.get("environment")
    out = dict(env) if isinstance(env, Mapping) else {}
    if out and "stand_ins" in d and "stand_ins" not in out:  # "none" only when the child reported at all
        out["stand_ins"] = d["stand_ins"]
    if not out.get("engine") and (verdict.engine_version or out.get("sglang") or out.get("vllm")):
        out["engine"] = verdict.engine  # the verdict's own engine, never assumed to be SGLang
    if verdict.engine_version and not (out.get("engine_version") or out.get("sglang")):
        out["engine_version"] = verdict.engine_version
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
    """``(label, value)`` for every environment field and the stand-ins, then any other keys it carries."""
    env = environment(verdict)
    rows = [(label, _text(next((env[k] for k in keys if env.get(k) not in (None, "")), None)))
            for label, keys in ENVIRONMENT_FIELDS]
    rows.append((STAND_INS_LABEL, _text(env.get("stand_ins"))))
    known = {k for _, keys in ENVIRONMENT_FIELDS for k in keys} | {"stand_ins"}
    rows += [(str(k), _text(v)) for k, v in env.items() if k not in known]
    return rows
