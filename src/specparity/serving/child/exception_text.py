"""An engine's exception as report text: every line of its reason, shortened, never cut to the first line.

Engines put the reason after a header line: pydantic's ``ValidationError`` (what vLLM's config classes raise,
e.g. vllm 0.32 ``engine/arg_utils.py`` building ``SpeculativeConfig``/``ParallelConfig``) reads
"1 validation error for SpeculativeConfig" and only its second line says what is wrong. So the text keeps
every non-empty line, joined with `` | ``, and shortens only what carries no reason: pydantic's
"For further information visit <url>" lines, the ``input_value=`` repr of the arguments (which can hold the
whole engine config), and any line or total past a budget (the head of each line is kept, where the reason is).

Imported by the engine children (serving/sglang, serving/vllm): standard library only.
"""

from __future__ import annotations

import re

LINE_LIMIT = 400  # characters kept of one line of the message
TOTAL_LIMIT = 1600  # characters kept of the whole message
_NOISE = re.compile(r"^\s*For further information visit https?://", re.IGNORECASE)
_INPUT_VALUE = re.compile(r"input_value=.*?, input_type=")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exception_text(exc: BaseException) -> str:
    """``type(exc).__name__: line 1 | line 2 | ...``: the reason kept, noise dropped, long parts shortened."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip() and not _NOISE.match(ln)]
    lines = [_short(_INPUT_VALUE.sub("input_value=..., input_type=", ln), LINE_LIMIT) for ln in lines]
    body = _short(" | ".join(lines), TOTAL_LIMIT)
    return f"{type(exc).__name__}: {body}" if body else type(exc).__name__
