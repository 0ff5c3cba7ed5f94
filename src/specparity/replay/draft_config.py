"""What a draft directory's ``config.json`` asks of the training-side EAGLE-3 drafter, in either format.

Two formats, one :class:`DraftShape`:

- **SGLang export** (SpecForge ``to_sglang``): ``architectures: [LlamaForCausalLMEagle3]``, sizes at the top
  level, ids in ``eagle_config``; read as SGLang 0.5.23 ``models/llama_eagle3.py`` reads it.
- **speculators** (``speculators_model_type: eagle3``, speculators 0.9 ``models/eagle3/config.py``): sizes in
  ``transformer_layer_config``, the EAGLE-3 fields (``draft_vocab_size``, ``target_hidden_size``,
  ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``, ids) at the top level; read as vLLM
  0.32 reads it (``transformers_utils/configs/speculators/algos.py:15-50`` copies those fields into the
  ``transformer_layer_config`` it serves, ``models/llama_eagle3.py`` builds the drafter from that).

Whatever the drafter does not implement is refused with :class:`UnsupportedDrafter` naming the key, never
guessed; so is a key whose absence the trainer and the engine read differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specparity.errors import InputError

ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS = "speculators"
# the draft-config format SGLang reads and exports (and SpecForge writes): SGLang's own, beside SPECULATORS
SGLANG_EXPORT = "sglang_export"


class UnsupportedDrafter(InputError):
    """The draft config asks for something this drafter does not implement (names the key)."""


@dataclass(frozen=True)
class DraftShape:
    """Sizes and flags of a one-layer EAGLE-3 drafter."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    num_aux: int
    draft_vocab: int
    rms_eps: float
    rope_theta: float
    head_dim_config: int | None = None  # config.head_dim when given
    target_hidden: int | None = None  # config.target_hidden_size when given
    norm_output: bool = False
    fc_bias: bool = False
    # layer 0's residual is the hidden_norm-ed input, not the raw one (speculators models/eagle3/
    # model_definitions.py:77-81; vLLM 0.32 models/llama_eagle3.py:101-122); SGLang 0.5.23 has no such option
    norm_before_residual: bool = False

    @property
    def head_dim(self) -> int:
        """Per-head width (`# sglang 0.5.23 models/llama.py:196-198`: config.head_dim, else hidden // heads)."""
        return self.head_dim_config or self.hidden // self.heads

    @property
    def target_hidden_size(self) -> int:
        """H_t (`# sglang 0.5.23 models/llama_eagle3.py:151-154`)."""
        return self.target_hidden or self.hidden

    @property
    def fc_in_features(self) -> int:
        return self.num_aux * self.target_hidden_size


@dataclass(frozen=True)
class DraftConfig:
    """A draft config read for the training side: its format, the drafter's shape, and the vocab facts."""

    format: str  # SGLANG_EXPORT or SPECULATORS
    shape: DraftShape
    draft_vocab_size: int | None  # as the config states it (None: SGLang's default, the target's vocab)
    # the checkpoint's own embed_tokens.weight, when it has one, is the drafter's embedding (speculators trains
    # with it; vLLM 0.32 keeps it when it differs from the target's, v1/spec_decode/llm_base_proposer.py:1436-1465);
    # SGLang shares the target's (`# sglang 0.5.23 speculative/eagle_worker_v2.py:376-378`)
    own_embedding: bool


def _refuser(path: str | Path) -> Any:
    def refuse(key: str, why: str) -> UnsupportedDrafter:
        return UnsupportedDrafter(f"{why}; the training-side drafter implements only the plain one-layer "
                                  "llama EAGLE-3 path, so it cannot replay this drafter", path=path, field=key)
    return refuse


def _plain_llama(cfg: dict[str, Any], *, path: str | Path, prefix: str = "") -> None:
    """What both formats refuse alike in the decoder layer's settings (``prefix`` names where they live)."""
    refuse = _refuser(path)
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        raise refuse(f"{prefix}num_hidden_layers", f"num_hidden_layers is {cfg.get('num_hidden_layers')}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise refuse(f"{prefix}hidden_act", f"hidden_act is {cfg.get('hidden_act')!r}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise refuse(f"{prefix}attention_bias", "attention_bias/mlp_bias is set")
    if cfg.get("tie_word_embeddings"):
        raise refuse(f"{prefix}tie_word_embeddings", "tie_word_embeddings is true (lm_head = embedding)")
    if cfg.get("rope_is_neox_style", True) is not True:
        raise refuse(f"{prefix}rope_is_neox_style", "rope_is_neox_style is false")
    for key in ("rope_scaling", "rope_parameters"):
        spec = cfg.get(key) or {}
        kind = spec.get("rope_type", spec.get("type", "default")) if isinstance(spec, dict) else spec
        if kind not in (None, "default"):
            raise refuse(f"{prefix}{key}", f"{key} asks for rope type {kind!r}")


def _sizes(cfg: dict[str, Any], *, path: str | Path, num_aux: int, draft_vocab: int | None,
           target_hidden: int | None, norm_output: bool, fc_bias: bool, norm_before_residual: bool) -> DraftShape:
    rope_params = cfg.get("rope_parameters") or {}
    try:
        return DraftShape(
            hidden=int(cfg["hidden_size"]), intermediate=int(cfg["intermediate_size"]),
            heads=int(cfg["num_attention_heads"]),
            kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            num_aux=int(num_aux), draft_vocab=int(draft_vocab or cfg["vocab_size"]),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            head_dim_config=int(cfg["head_dim"]) if cfg.get("head_dim") else None,
            target_hidden=int(target_hidden) if target_hidden else None,
            norm_output=norm_output, fc_bias=fc_bias, norm_before_residual=norm_before_residual,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"draft config lacks or mangles a size field: {e}", path=path) from None


# a key of SGLang's export format, looked up as SGLang's llama_eagle3.py looks it up (eagle_config first)
def _sglang_value(cfg: dict[str, Any], key: str) -> Any:
    ec = cfg.get("eagle_config")
    if isinstance(ec, dict) and key in ec:
        return ec[key]
    return cfg.get(key)


# the reader of SGLANG_EXPORT, SGLang's format (its sibling _speculators reads the other)
def _sglang_export(cfg: dict[str, Any], *, path: str | Path) -> DraftConfig:
    refuse = _refuser(path)
    archs = cfg.get("architectures") or []
    if ARCHITECTURE not in archs:
        raise refuse("architectures", f"architectures is {archs}, not [{ARCHITECTURE!r}]")
    _plain_llama(cfg, path=path)
    if _sglang_value(cfg, "norm_before_fc"):  # llama_eagle3.py:173-175 reads eagle_config, then top level
        raise refuse("norm_before_fc", "norm_before_fc is set")
    if cfg.get("fc_norm") or cfg.get("use_aux_norm"):  # llama_eagle3.py:185-187
        raise refuse("fc_norm", "fc_norm/use_aux_norm is set")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    shape = _sizes(cfg, path=path, num_aux=cfg.get("num_aux_hidden_states") or (len(ids) if ids else 3),  # :157-161
                   draft_vocab=cfg.get("draft_vocab_size"), target_hidden=cfg.get("target_hidden_size"),
                   norm_output=bool(cfg.get("norm_output", False)),  # llama_eagle3.py:207
                   fc_bias=bool(cfg.get("bias", False)),  # llama_eagle3.py:166; a checkpoint bias alone is ignored
                   norm_before_residual=False)
    return DraftConfig(SGLANG_EXPORT, shape, cfg.get("draft_vocab_size"), own_embedding=False)


def _speculators(cfg: dict[str, Any], *, path: str | Path) -> DraftConfig:
    refuse = _refuser(path)
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise refuse("speculators_model_type", f"speculators_model_type is {kind!r}, not 'eagle3'")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise InputError("a speculators eagle3 config needs transformer_layer_config as an object (vLLM 0.32 "
                         "configs/speculators/base.py:88-94)", path=path, field="transformer_layer_config")
    tl = "transformer_layer_config."
    model_type = layer.get("model_type", "llama")  # vLLM's default too (algos.py:43)
    if model_type != "llama":
        raise refuse(f"{tl}model_type", f"the decoder layer is {model_type!r}, not 'llama'")
    _plain_llama(layer, path=path, prefix=tl)
    if any(t != "full_attention" for t in layer.get("layer_types") or ()):
        raise refuse(f"{tl}layer_types", f"layer_types is {layer.get('layer_types')} (sliding-window attention)")
    if cfg.get("norm_before_fc"):  # algos.py:36 -> llama_eagle3.py:184-188
        raise refuse("norm_before_fc", "norm_before_fc is set")
    if cfg.get("fc_norm"):  # algos.py:37 -> llama_eagle3.py:231-238
        raise refuse("fc_norm", "fc_norm is set")
    if "norm_before_residual" not in cfg:
        # speculators' own config defaults it to false (models/eagle3/config.py), vLLM 0.32 to true
        # (configs/speculators/algos.py:33-35): trained and served drafters would differ; never guess which
        raise refuse("norm_before_residual", "norm_before_residual is absent, which speculators reads as false "
                     "and vLLM 0.32 as true (configs/speculators/algos.py:33-35); set it explicitly")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    shape = _sizes(layer, path=path, num_aux=len(ids) if ids else 3,  # speculators models/eagle3/core.py:72-76
                   draft_vocab=cfg.get("draft_vocab_size"), target_hidden=cfg.get("target_hidden_size"),
                   norm_output=bool(cfg.get("norm_output", False)),  # algos.py:38 -> llama_eagle3.py:252, 286
                   fc_bias=False,  # llama_eagle3.py:242-250 builds fc without a bias
                   norm_before_residual=bool(cfg["norm_before_residual"]))
    return DraftConfig(SPECULATORS, shape, cfg.get("draft_vocab_size"), own_embedding=True)


def read_draft_config(cfg: dict[str, Any], *, path: str | Path) -> DraftConfig:
    """The :class:`DraftConfig` of a draft ``config.json`` (either format); refuses what it does not implement."""
    if "speculators_model_type" in cfg or "speculators_config" in cfg:
        return _speculators(cfg, path=path)
    return _sglang_export(cfg, path=path)


def shape_from_config(cfg: dict[str, Any], *, path: str | Path) -> DraftShape:
    """The :class:`DraftShape` of a draft ``config.json`` (either format)."""
    return read_draft_config(cfg, path=path).shape
