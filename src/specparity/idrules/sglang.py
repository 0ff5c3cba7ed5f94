"""What SGLang's target captures for a given draft config: the ``set_eagle3_layers_to_capture`` rules.

This module models, per architecture family and SGLang version, the boundary list the target's setter stores
(``model.layers_to_capture``), which of those boundaries the model's layer loop actually reaches, whether the
forward crashes, and the canonical sources that reach the drafter's ``fc``, in fc-chunk order
(domain.md §3.1, §6, §7 D1-D12). It also inverts the rules: which draft-config ids make a given SGLang
version serve a given source list.

Evidence: every rule below cites the SGLang file it was read from. Rules read only in the 0.5.23 wheel
(installed here) and extended to other versions are marked ``[inferred]`` in the comments; where a
version's behaviour is unknown the model predicts the conservative outcome (a crash or an unreachable
boundary), so :func:`ids_for_sources` never promises a layout it cannot vouch for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from itertools import pairwise

from specparity.sources import FINAL_NORM, boundary_to_source, check_in_range, source_to_boundary

__all__ = [
    "ArchFamily",
    "SGLangCapturePlan",
    "arch_family",
    "capture_plan",
    "default_boundaries",
    "ids_for_sources",
    "parse_version",
]


class ArchFamily(str, Enum):
    """Which ``set_eagle3_layers_to_capture`` rule an architecture's SGLang model file follows."""

    LLAMA = "llama"
    DEEPSEEK = "deepseek"
    GPT_OSS = "gpt_oss"
    MINIMAX_M3 = "minimax_m3"


# sglang 0.5.23: deepseek_v2.py:3458-3473 (DeepseekV2/V3/V32ForCausalLM, EntryClass :3595),
# glm4_moe_lite.py:805-820 (same "first id 1" rule), kimi_k25.py:928-939 (delegates to DeepseekV3ForCausalLM).
# Subclasses that inherit DeepseekV2ForCausalLM's setter and loop, found on the real registry by
# tests/serving/test_static_registry.py: MistralLarge3ForCausalLM (mistral_large_3.py:12) and
# GlmMoeDsaForCausalLM (glm4_moe.py, a DeepseekV2ForCausalLM subclass).
_DEEPSEEK_ARCHS = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
     "MistralLarge3ForCausalLM", "GlmMoeDsaForCausalLM"}
)
# The deepseek_v2.py model loop packs captures with AuxHiddenStatePacker (deepseek_v2.py:3175, :3245);
# glm4_moe_lite.py:647 still uses a plain AuxHiddenStateList, so it never raises "captured X of Y".
_PACKER_ARCHS = _DEEPSEEK_ARCHS
# sglang 0.5.23 minimax_m3_vl.py:246-263 applies +1 to the default too; minimax_m3.py:2056-2069
# (MiniMaxM3SparseForCausalLM) does NOT (default [2, L//2, L-3]) although its sibling's comment says it mirrors it.
_MINIMAX_DEFAULT_PLUS_ONE = frozenset({"MiniMaxM3SparseForConditionalGeneration"})


def arch_family(architecture: str) -> ArchFamily:
    """The setter family of an HF ``architectures[0]`` name.

    Unknown architectures map to :attr:`ArchFamily.LLAMA`: of the 29 model files with an EAGLE-3 setter
    in sglang 0.5.23, all but deepseek_v2, glm4_moe_lite, gpt_oss and the MiniMax-M3 pair apply the plain
    ``+1`` of ``models/llama.py:929-941``.
    """
    if architecture in _DEEPSEEK_ARCHS or architecture.startswith("Glm4MoeLite"):
        return ArchFamily.DEEPSEEK
    if architecture == "GptOssForCausalLM":
        return ArchFamily.GPT_OSS
    if architecture.startswith("MiniMaxM3"):
        return ArchFamily.MINIMAX_M3
    return ArchFamily.LLAMA


_VERSION_RE = re.compile(
    r"^v?(\d+)\.(\d+)(?:\.(\d+))?"
    r"(?:[.-]?(a|alpha|b|beta|rc|c)(\d*))?"
    r"(?:[.-]?post(\d*))?"
    r"(?:[.-]?dev(\d*))?"
    r"(?:\+[0-9A-Za-z.]+)?$"
)
_PRE_RANK = {"a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "c": -1}


def parse_version(v: str) -> tuple[int, ...]:
    """A comparable tuple ``(major, minor, patch, stage, n)`` for an SGLang version string.

    ``stage`` orders dev (-4) < alpha (-3) < beta (-2) < rc (-1) < release (0) < post (1), so
    ``"0.5.0rc0" < "0.5.0" < "0.4.10.post2"``-style comparisons follow PEP 440 for the forms SGLang
    publishes. A local suffix (``+cpu``) is ignored. Raises ValueError on anything else.
    """
    m = _VERSION_RE.match(v.strip())
    if m is None:
        raise ValueError(f"not a version string: {v!r}")
    major, minor, patch, pre, pre_n, post, dev = m.groups()
    release = (int(major), int(minor), int(patch or 0))
    if post is not None:
        return (*release, 1, int(post or 0))
    if pre is not None:
        return (*release, _PRE_RANK[pre], int(pre_n or 0))
    if dev is not None:
        return (*release, -4, int(dev or 0))
    return (*release, 0, 0)


def _v(s: str) -> tuple[int, ...]:
    return parse_version(s)


_FIRST_EAGLE3 = _v("0.4.4.post2")  # models/llama_eagle3.py is absent in 0.4.4.post1 (domain.md §6)
_IDS_HONOURED = _v("0.4.9")  # D1/D2: <=0.4.8 setter takes no ids (models/llama.py:700, 0.4.8)
_DEEPSEEK_SETTER = _v("0.5.6")  # deepseek_v2 gets a setter (+1) in 0.5.6 (domain.md §6 family B)
_DEEPSEEK_FIRST_ID_RULE = _v("0.5.13")  # D6, sglang #25454; 0.5.23 deepseek_v2.py:3470-3473
_GPT_OSS_BOUNDARY_RULE = _v("0.5.17")  # D7, sglang #32334; 0.5.23 gpt_oss.py:1347-1352 and :730-737
_MINIMAX_DEFAULT_RULE = _v("0.5.18")  # D8; 0.5.23 minimax_m3_vl.py:259-263
_MINIMAX_FINAL_BOUNDARY = _v("0.5.23")  # 0.5.23 minimax_m3.py:1955-1963; earlier versions not read
_PACKER = _v("0.5.23")  # 0.5.23 layers/aux_hidden_states.py:84-89; earlier deepseek_v2.py not read
_CUDA_GRAPH_ORDER_FIXED = _v("0.5.11")  # D3

# D9: from which version boundary 0 serves `embedding`; below it the layer computes `hs + None` (TypeError).
# Keys are architectures; families fall back to _EMBEDDING_FROM_FAMILY.
_EMBEDDING_FROM_ARCH = {
    "Qwen2ForCausalLM": _IDS_HONOURED,  # qwen2.py/qwen3.py pass residual=None safely since 0.4.9 (D9)
    "Qwen3ForCausalLM": _IDS_HONOURED,
    # qwen2_moe's loop adds the residual only when it is not None wherever it captures: 0.4.10.post2
    # models/qwen2_moe.py:478-482, 0.5.3 :590-594, then the communicator path (0.5.10 :631, :688); measured: the
    # seed's ids [-1, 1, 3] serve embedding on Qwen3-MoE on 0.4.10.post2 (tests/serving/test_real_class_capture.py)
    "Qwen2MoeForCausalLM": _IDS_HONOURED,
    "Qwen3MoeForCausalLM": _IDS_HONOURED,
    "Glm4MoeForCausalLM": _v("0.5.21"),  # glm4_moe <=0.5.20 crashes (D9)
}
_EMBEDDING_FROM_FAMILY = {
    ArchFamily.LLAMA: _v("0.5.22"),  # llama <=0.5.21 crashes; layer_boundary stage.py:421-434 from 0.5.22
    # deepseek_v2 0.5.6-0.5.10 crashes; 0.5.11+ serves embedding [inferred: D9 says >=0.5.15 via communicator,
    # domain.md table 3.3 shows embedding for >=0.5.13; 0.5.11-0.5.12 not read]
    ArchFamily.DEEPSEEK: _v("0.5.11"),
    ArchFamily.GPT_OSS: _GPT_OSS_BOUNDARY_RULE,  # gpt_oss <=0.5.16 crashes (D9)
    ArchFamily.MINIMAX_M3: _v("0.5.22"),  # [inferred] layer_boundary refactor; 0.5.18-0.5.21 not read
}

TYPE_ERROR_HS_NONE = "TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'"


@dataclass(frozen=True)
class SGLangCapturePlan:
    """What one SGLang version does with one draft config's ids on one target architecture.

    ``layers_to_capture`` is the boundary list exactly as the setter stores it; ``served_sources`` is what
    reaches ``fc`` (ascending, deduplicated, reachable boundaries only), empty when the forward crashes.
    """

    version: str
    architecture: str
    num_layers: int
    config_ids: tuple[int, ...] | None
    ids_used: tuple[int, ...] | None
    used_default: bool
    layers_to_capture: tuple[int, ...]
    served_sources: tuple[str, ...]
    unreachable: tuple[int, ...]
    crash: str | None
    notes: tuple[str, ...] = ()

    @property
    def family(self) -> ArchFamily:
        """The setter family of :attr:`architecture`."""
        return arch_family(self.architecture)


def _check_args(num_layers: int, version: str) -> tuple[int, ...]:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    v = parse_version(version)
    if v < _FIRST_EAGLE3:
        raise ValueError(f"sglang {version} predates EAGLE-3 (first release with it: 0.4.4.post2)")
    return v


def default_boundaries(num_layers: int, *, architecture: str, version: str) -> tuple[int, ...]:
    """The boundaries SGLang's setter stores when the draft config has no ids (or when ids are ignored).

    ``[2, L//2, L-3]`` everywhere (models/llama.py:933-936, 0.5.23), except MiniMax-M3's VL class from
    0.5.18, which adds 1 to the default as well: ``[3, L//2+1, L-2]`` (minimax_m3_vl.py:259-263, 0.5.23).
    """
    v = _check_args(num_layers, version)
    default = (2, num_layers // 2, num_layers - 3)
    if (
        arch_family(architecture) is ArchFamily.MINIMAX_M3
        and architecture in _MINIMAX_DEFAULT_PLUS_ONE
        and v >= _MINIMAX_DEFAULT_RULE
    ):
        return tuple(b + 1 for b in default)
    return default


def _setter(
    ids: Sequence[int], family: ArchFamily, v: tuple[int, ...], num_layers: int
) -> list[int]:
    """The list the setter stores for explicit ids (the default path is handled by the caller)."""
    plus_one = [i + 1 for i in ids]
    if family is ArchFamily.DEEPSEEK and v >= _DEEPSEEK_FIRST_ID_RULE:
        # 0.5.23 deepseek_v2.py:3470-3473: `if layer_ids and layer_ids[0] == 1: +1 else list(layer_ids)`
        return plus_one if ids and ids[0] == 1 else list(ids)
    if family is ArchFamily.GPT_OSS and v >= _GPT_OSS_BOUNDARY_RULE:
        # 0.5.23 gpt_oss.py:1349-1352: `if layer_ids and max(layer_ids) == num_layers: raw else +1`
        return list(ids) if ids and max(ids) == num_layers else plus_one
    # 0.5.23 llama.py:941, qwen2.py:794, qwen3.py:791, minimax_m3.py:2069, minimax_m3_vl.py:263;
    # deepseek_v2 0.5.6-0.5.12 and gpt_oss <=0.5.16 likewise (domain.md §3.1)
    return plus_one


def _max_reachable(family: ArchFamily, v: tuple[int, ...], num_layers: int) -> int:
    """The largest boundary the model's forward can capture."""
    if family is ArchFamily.GPT_OSS and v >= _GPT_OSS_BOUNDARY_RULE:
        return num_layers  # 0.5.23 gpt_oss.py:730-737 captures at final_norm entry when end_layer is listed
    if family is ArchFamily.MINIMAX_M3 and v >= _MINIMAX_FINAL_BOUNDARY:
        return num_layers  # 0.5.23 minimax_m3.py:1955-1963, same end_layer capture
    # 0.5.23 llama.py:485-493 / deepseek_v2.py:3176-3195: `for i in range(start, end): ... i in layers_to_capture`
    return num_layers - 1


def _embedding_from(architecture: str, family: ArchFamily) -> tuple[int, ...]:
    return _EMBEDDING_FROM_ARCH.get(architecture, _EMBEDDING_FROM_FAMILY[family])


def capture_plan(
    config_ids: Sequence[int] | None, *, num_layers: int, architecture: str, version: str
) -> SGLangCapturePlan:
    """Model ``set_eagle3_layers_to_capture(config_ids)`` and the target forward for one SGLang version.

    ``config_ids`` are the ids as read from the draft config's ``eagle_config.eagle_aux_hidden_state_layer_ids``
    (None = absent: SGLang's default path). ``architecture`` is the target's ``architectures[0]``.
    """
    v = _check_args(num_layers, version)
    family = arch_family(architecture)
    ids = None if config_ids is None else tuple(int(i) for i in config_ids)
    notes: list[str] = []
    # what every outcome of this call records about its inputs
    plan = partial(SGLangCapturePlan, version=version, architecture=architecture, num_layers=num_layers,
                   config_ids=ids)

    if family is ArchFamily.DEEPSEEK and v < _DEEPSEEK_SETTER:
        return plan(
            ids_used=None, used_default=False, layers_to_capture=(), served_sources=(), unreachable=(),
            crash=f"unsupported: {architecture} has no set_eagle3_layers_to_capture before sglang 0.5.6",
        )

    if ids is None or v < _IDS_HONOURED:
        # D1: <=0.4.8 the setter is called with no args (models/llama.py:700, 0.4.8) and ignores the config.
        stored = list(default_boundaries(num_layers, architecture=architecture, version=version))
        ids_used: tuple[int, ...] | None = None
        used_default = True
        if ids is not None:
            notes.append(f"sglang {version} ignores draft-config ids (D1); the default was served")
    else:
        stored = _setter(ids, family, v, num_layers)
        ids_used = ids
        used_default = False
        default = list(default_boundaries(num_layers, architecture=architecture, version=version))
        if v < _CUDA_GRAPH_ORDER_FIXED and stored != default:
            notes.append(
                "D3 [inferred]: on sglang 0.4.9-0.5.10 CUDA-graph-replayed batches (decode/verify) capture the "
                f"default boundaries {default}; only eager extend uses these ids"
            )

    top = _max_reachable(family, v, num_layers)
    reached = sorted({b for b in stored if 0 <= b <= top})
    unreachable = tuple(b for b in stored if not 0 <= b <= top)

    crash: str | None = None
    if 0 in reached and v < _embedding_from(architecture, family):
        # D9: layer 0 has no residual yet; pre-layer_boundary code computes `hidden_states + residual`
        # with residual None (0.5.3 models/llama.py:340, 0.4.10.post2 :332) [measured on llama].
        crash = TYPE_ERROR_HS_NONE
    elif architecture in _PACKER_ARCHS and v >= _PACKER and reached and len(reached) != len(stored):
        # 0.5.23 deepseek_v2.py:3175 sizes the packer by len(layers_to_capture) (duplicates and unreachable
        # entries included); finalize() raises at layers/aux_hidden_states.py:84-89.
        crash = f"RuntimeError: captured {len(reached)} of {len(stored)} aux hidden states"
    elif not reached:
        # llama.py:502-503 returns a bare tensor when nothing was captured; llama.py:620-621 unpacks it as
        # (hidden, aux) because capture_aux_hidden_states is True.
        crash = "no aux hidden state captured: the target returns a bare tensor where SGLang unpacks (hidden, aux)"

    served = () if crash is not None else tuple(boundary_to_source(b, num_layers) for b in reached)
    return plan(
        ids_used=ids_used, used_default=used_default, layers_to_capture=tuple(stored), served_sources=served,
        unreachable=unreachable, crash=crash, notes=tuple(notes),
    )


def _candidates(boundaries: list[int], family: ArchFamily, v: tuple[int, ...]) -> list[list[int]]:
    """Id lists worth trying, most portable first (the ``+1`` form is what SpecForge and llama-style expect)."""
    plus_one_form = [b - 1 for b in boundaries]
    out = [plus_one_form]
    if family in (ArchFamily.DEEPSEEK, ArchFamily.GPT_OSS) and v >= _IDS_HONOURED:
        out.append(list(boundaries))  # raw form (deepseek first id != 1; gpt_oss max(ids) == L)
        if len(boundaries) >= 2:
            # DeepSeek >=0.5.13 with layer:0 first: raw [1, ...] would trigger +1 and [0, ...] would be read
            # raw, so only a list whose first id is not 1 works; order is irrelevant to the served layout (D12).
            out.append([boundaries[1], boundaries[0], *boundaries[2:]])
    return out


def ids_for_sources(
    sources: Sequence[str], *, num_layers: int, architecture: str, version: str
) -> list[int] | None:
    """The draft-config ids that make this SGLang version/architecture serve exactly ``sources`` to ``fc``.

    Returns None when no id list does (a non-ascending or empty list, ``final_norm``, ``layer:L-1`` where the
    loop stops at ``L-1``, ``embedding`` where boundary 0 crashes, anything but the default on <=0.4.8).
    Prefers the ``+1`` form (``layer:v`` -> ``v``), which SpecForge and every llama-style file read the same
    way. Raises ValueError for a malformed or out-of-range source name.
    Guarantee: ``capture_plan(ids, ...).served_sources == tuple(sources)`` whenever ids is not None.
    """
    for s in sources:
        check_in_range(s, num_layers)
    _check_args(num_layers, version)
    if not sources or FINAL_NORM in sources:
        return None
    boundaries = [source_to_boundary(s, num_layers) for s in sources]
    if any(a >= b for a, b in pairwise(boundaries)):
        return None  # D12: every version concatenates ascending and collapses duplicates
    v = parse_version(version)
    for ids in _candidates(boundaries, arch_family(architecture), v):
        plan = capture_plan(ids, num_layers=num_layers, architecture=architecture, version=version)
        if plan.crash is None and plan.served_sources == tuple(sources):
            return ids
    return None
