"""Contract schema v1: what the drafter's ``fc`` was trained on, in tool-independent terms.

A contract is written at training time and checked at serving time. It names the hidden-state
sources in the canonical vocabulary of :mod:`specparity.sources` and keeps the raw ids only as
provenance, together with the convention that gives them meaning (domain.md §2, rule 1).

Every model forbids unknown keys, so a typo in a hand-edited contract is an error that names the
field instead of a silently ignored key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from specparity import sources as src
from specparity.contract.conventions import IdConvention as IdConvention
from specparity.contract.conventions import ids_to_sources

SCHEMA_VERSION = 1

DType = Literal["float32", "bfloat16", "float16"]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _check_source(name: str) -> str:
    if not src.is_source(name):
        raise ValueError(f"{name!r} is not a canonical source (embedding, layer:<i>, final_norm)")
    return name


SourceName = Annotated[str, AfterValidator(_check_source)]


# JSON has no NaN or Infinity (RFC 8259), but Python's json module reads and writes the bare tokens; every number
# of a contract is finite, so a NaN never reaches a comparison that it would silently skip
FINITE = "a finite number: NaN and Infinity are refused"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


class TargetSpec(_Strict):
    """The target model the hidden states were taken from."""

    architecture: str = Field(min_length=1, description="HF architectures[0], e.g. LlamaForCausalLM")
    num_hidden_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    dtype: DType
    name_or_path: str | None = None
    config_fingerprint: Sha256 = Field(description="sha256 of the config fields listed in fingerprint_fields")
    fingerprint_fields: list[str]
    tokenizer_fingerprint: Sha256 | None = None
    chat_template_fingerprint: Sha256 | None = None


class RawLayerIds(_Strict):
    """The ids exactly as the training tool wrote them, and who interprets them."""

    ids: list[int] | None = Field(description="as written; null when the tool wrote none and used its default")
    convention: IdConvention
    origin: Literal["draft_config", "run_config", "tool_default"]
    tool: str
    tool_version: str | None = None
    resolver_version: str | None = Field(
        default=None, description="version of the engine whose rule turned the ids into sources (SpecForge: its SGLang)"
    )
    architecture: str = Field(description="target architecture that interprets the ids")


class FcInputLayout(_Strict):
    """The layout of ``fc``'s input: concatenated chunks, one per source, in fc-chunk order."""

    sources: list[SourceName] = Field(min_length=1)
    chunk_widths: list[int]
    total_width: int = Field(ge=1)
    capture_point: Literal["residual_stream_pre_final_norm"] = "residual_stream_pre_final_norm"
    dtype: DType

    @model_validator(mode="after")
    def _widths(self) -> FcInputLayout:
        if len(set(self.sources)) != len(self.sources):
            dup = sorted({s for s in self.sources if self.sources.count(s) > 1})
            raise ValueError(f"sources must be distinct; repeated: {dup}")
        if len(self.chunk_widths) != len(self.sources):
            raise ValueError(f"chunk_widths has {len(self.chunk_widths)} entries for {len(self.sources)} sources")
        if any(w < 1 for w in self.chunk_widths):
            raise ValueError("chunk_widths must be positive")
        if sum(self.chunk_widths) != self.total_width:
            raise ValueError(f"total_width {self.total_width} != sum(chunk_widths) {sum(self.chunk_widths)}")
        return self


class VocabMap(_Strict):
    """Fingerprint of the draft-to-target vocabulary mapping (SpecForge ``d2t``/``t2d``)."""

    draft_vocab_size: int = Field(ge=1)
    d2t_sha256: Sha256
    t2d_sha256: Sha256 | None = None
    d2t_semantics: Literal["offset"] = Field(
        default="offset", description="target_id = draft_id + d2t[draft_id] (SGLang llama_eagle3.py hot_token_id)"
    )


class DrafterSpec(_Strict):
    architecture: str = "LlamaForCausalLMEagle3"
    hidden_size: int = Field(ge=1)
    fc_in_features: int = Field(ge=1)
    fc_out_features: int = Field(ge=1)
    fc_bias: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    draft_vocab_size: int = Field(ge=1)
    vocab_map: VocabMap | None = None
    checkpoint_keys: list[str] | None = Field(default=None, description="weight names training produced")
    # the drafter's family (specparity.drafters): which engine path serves it; left out of the JSON for the
    # Llama-style EAGLE-3 head, so contracts written before it existed keep their content hash
    family: Literal["eagle3", "eagle3-mla", "dflash"] = Field(
        default="eagle3", exclude_if=lambda v: v == "eagle3",
        description="eagle3 (Llama-style EAGLE-3 head), eagle3-mla (MLA EAGLE-3 head) or dflash")

    @model_validator(mode="after")
    def _norms(self) -> DrafterSpec:
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("norm_before_fc and fc_norm are mutually exclusive")
        if self.vocab_map is not None and self.vocab_map.draft_vocab_size != self.draft_vocab_size:
            raise ValueError("vocab_map.draft_vocab_size differs from draft_vocab_size")
        return self


class TokenAlignment(_Strict):
    """Recorded row t belongs to token t; the drafter pairs aux row t with the embedding of token t+1."""

    recorded_row: Literal["token_t"] = "token_t"
    drafter_pairs: Literal["aux_t_with_token_t_plus_1"] = "aux_t_with_token_t_plus_1"


class SpecConfig(_Strict):
    """The speculative settings the drafter is meant to be served with."""

    num_steps: int | None = Field(default=None, ge=1)
    eagle_topk: int | None = Field(default=None, ge=1)
    num_draft_tokens: int | None = Field(default=None, ge=1)


Rate = Annotated[float, Field(ge=0, le=1, description=f"a rate in 0..1, {FINITE}")]


class TrainingOutcome(_Strict):
    accuracy_per_position: list[Rate] | None = None
    acceptance_per_position: list[Rate] | None = None
    expected_acceptance_length: float | None = Field(default=None, ge=0, description=FINITE)


class Tolerance(_Strict):
    """Overrides of the comparison thresholds; a field left unset keeps the dtype's default
    (``specparity.compare.tolerances.default_tolerance``)."""

    atol: float | None = Field(default=None, ge=0, description=FINITE)
    rtol: float | None = Field(default=None, ge=0, description=FINITE)
    cosine_floor: float | None = Field(default=None, ge=-1, le=1, description=FINITE)
    min_margin: float | None = Field(default=None, ge=0,
                                     description=f"best minus runner-up cosine to attribute; {FINITE}")
    max_rel_err: float | None = Field(default=None, ge=0, description=FINITE)


class Tolerances(_Strict):
    """Per-dtype defaults live in specparity (compare/tolerances.py); the contract carries overrides."""

    default: Tolerance = Field(default_factory=Tolerance, description="applies to every chunk")
    per_dtype: dict[DType, Tolerance] = Field(default_factory=dict, description="by the dtype being compared")
    per_chunk: dict[int, Tolerance] = Field(default_factory=dict, description="chunk index -> override")


class ProbePackRef(_Strict):
    """The probe pack: a safetensors file beside the contract with a few samples' ids and fc inputs."""

    file: str = Field(min_length=1, description="path relative to the contract file")
    sha256: Sha256
    num_samples: int = Field(ge=1)
    num_tokens: int = Field(ge=1)


class AssumedLayout(_Strict):
    """Why ``fc_input`` is assumed rather than recorded: a contract written from configs alone, no probes
    (``specparity contract from-config``). The static gate can check it; capture and outcome cannot."""

    reason: str = Field(min_length=1, description="how the layout was derived, with the rule's citation")
    trainer: Literal["specforge", "speculators", "eagle"]
    trainer_sglang_version: str | None = Field(
        default=None, description="SGLang version whose setter the trainer's capture ran (SpecForge)"
    )
    trainer_sglang_version_assumed: bool = Field(
        default=False, description="true when trainer_sglang_version was not given but assumed"
    )


class Provenance(_Strict):
    run_id: str | None = None
    tool: str
    tool_version: str | None = None
    data_location: str | None = None
    created_at: datetime
    specparity_version: str


class Contract(_Strict):
    """What training promised. Serialized as JSON beside its probe pack. Every number in it is finite: JSON has
    no NaN or Infinity, and a contract holding the bare tokens is refused."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    content_hash: Sha256 | None = Field(default=None, description="sha256 of the canonical JSON without this field")
    target: TargetSpec
    fc_input: FcInputLayout
    layer_ids: RawLayerIds
    drafter: DrafterSpec
    alignment: TokenAlignment = Field(default_factory=TokenAlignment)
    serving: SpecConfig = Field(default_factory=SpecConfig)
    training_outcome: TrainingOutcome | None = None
    tolerances: Tolerances = Field(default_factory=Tolerances)
    # None only for a contract without recordings, which must say so in layout_assumed
    probes: ProbePackRef | None = Field(default=None, exclude_if=lambda v: v is None)
    provenance: Provenance
    layout_assumed: AssumedLayout | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _consistent(self) -> Contract:
        if self.probes is None and self.layout_assumed is None:
            raise ValueError("probes: required, unless layout_assumed says why there are no recordings")
        n = self.target.num_hidden_layers
        for i, name in enumerate(self.fc_input.sources):
            try:
                src.check_in_range(name, n)
            except ValueError as e:
                raise ValueError(f"fc_input.sources[{i}]: {e}") from None
        for i, w in enumerate(self.fc_input.chunk_widths):
            if w != self.target.hidden_size:
                raise ValueError(
                    f"fc_input.chunk_widths[{i}] = {w}, but every residual-stream chunk is "
                    f"target.hidden_size = {self.target.hidden_size} wide"
                )
        if self.fc_input.total_width != self.drafter.fc_in_features:
            raise ValueError(
                f"fc_input.total_width {self.fc_input.total_width} != drafter.fc_in_features {self.drafter.fc_in_features}"
            )
        if self.layer_ids.ids is not None:
            bad = [v for v in self.layer_ids.ids if v < -1 or v > n]
            if bad:
                raise ValueError(f"layer_ids.ids {bad} out of range for a {n}-layer target (-1..{n})")
        self._check_ids_derive_sources()
        for k in self.tolerances.per_chunk:
            if not 0 <= k < len(self.fc_input.sources):
                raise ValueError(f"tolerances.per_chunk key {k} is not a chunk index (0..{len(self.fc_input.sources) - 1})")
        return self

    def _check_ids_derive_sources(self) -> None:
        ids = self.layer_ids
        try:
            derived = ids_to_sources(
                ids.ids, ids.convention, num_layers=self.target.num_hidden_layers,
                architecture=ids.architecture, version=ids.resolver_version,
            )
        except ValueError as e:
            raise ValueError(f"layer_ids: {e}") from None
        if derived != list(self.fc_input.sources):
            raise ValueError(
                f"fc_input.sources {list(self.fc_input.sources)} disagree with layer_ids.ids {ids.ids} read as "
                f"{ids.convention.value}, which give {derived}"
            )
