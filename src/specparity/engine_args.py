"""Engine arguments as the user typed them (``KEY=VALUE`` text) -> keywords with typed values, in one place.

Text is typed once, here: ``true``/``false`` a bool, ``none``/``null`` None, an int, a float, else the string.
Values that arrive typed (a pyproject.toml table, plugin_deployments.py) are never passed through text. Standard
library only, so that the pytest plugin can type at collection without importing torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from specparity.errors import InputError


def parse_engine_args(pairs: Sequence[str], *, field: str = "--sglang-arg") -> dict[str, object]:
    """``["speculative_num_steps=3", "--dtype=bfloat16"]`` -> the engine's keywords with typed values (SGLang's
    ServerArgs, vLLM's engine arguments); ``field`` names the option the text came from in an error."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key.isidentifier():
            raise InputError(f"expected KEY=VALUE, got {pair!r}", field=field)
        out[key] = _typed(raw.strip())
    return out


def _typed(raw: str) -> object:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
