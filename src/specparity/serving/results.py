"""What a serving engine hands back: plain frozen records, JSON-(de)serialisable.

The JSON parts (:class:`SpecSettings`, :class:`ResolvedDeployment`, :class:`ServingFailure`) hold no
torch objects; they travel from the SGLang child process as JSON. Tensors (:class:`FcCapture`,
:class:`LayerAtlas`) travel separately as safetensors files (see ``serving/child/process.py``).

Sources are always named in the canonical vocabulary (``embedding``, ``layer:<i>``, ``final_norm``;
domain.md §2); raw SGLang ids and boundary indices are kept only as provenance.
"""

# Over the house's ~400 lines on purpose: this file is the whole record format that crosses the process boundary
# (every failure kind and every record, with its to_dict/from_dict), so that the JSON contract between the parent
# and both engines' children reads in one place.

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from specparity.compare.reduced import ReducedSample

# What a long engine run reports as it goes: progress(done, total) (the CLI's bars, serving/engine.py)
Progress = Callable[[int, int], None]

# Stable failure kinds. Reports, the pytest plugin and CI scripts key on these strings.
FC_NOT_CALLED = "fc_not_called"
CAPTURE_COUNT_SHORT = "capture_count_short"
CAPTURE_SHAPE = "capture_shape"
SGLANG_EXCEPTION = "sglang_exception"  # SGLang's own exception (vLLM's: vllm_exception); a report value
NONFINITE = "nonfinite"
TIMEOUT = "timeout"
SGLANG_MISSING = "sglang_missing"  # SGLang is not installed (vLLM's: vllm_missing); a report value
UNSUPPORTED_VERSION = "unsupported_version"
BAD_DEPLOYMENT = "bad_deployment"
CHILD_CRASHED = "child_crashed"
DRAFT_UNREADABLE = "draft_unreadable"  # a draft config SGLang cannot read at all (e.g. speculators format)
VLLM_EXCEPTION = "vllm_exception"  # vLLM raised: type, message and the innermost vllm file:line
VLLM_MISSING = "vllm_missing"
# SGLang asked this machine's GPU (a CUDA query through torch) and there is none: the check cannot run here
NEEDS_HARDWARE = "needs_hardware"
# a rank of the served world that should have reported evidence (vLLM collective_rpc) and did not: never a pass
# on partial evidence
RANK_MISSING = "rank_missing"
# a live check (serving/live/capture.py): the user's server exited or never answered /health (its log tail says why, where
# no engine exception in it decides otherwise); a running server that could not be read; a running server started
# without the engine's hook switches, so its fc input cannot be captured (the finding names the flags to add)
SERVER_FAILED = "server_failed"
SERVER_UNREACHABLE = "server_unreachable"
HOOKS_MISSING = "hooks_missing"
# a node of a multi-node server (SGLang --nnodes) whose hook evidence the gate could not read: its ranks are
# unaccounted for, so the check did not run on the whole deployment (the machine's reach, exit 3)
NODE_MISSING = "node_missing"
# the installed engine raised while it was imported, before it saw the deployment (a read-only HOME its import
# writes a cache into, a broken install): the machine's, never the deployment's
ENGINE_IMPORT = "engine_import"
# specparity's own code raised (an adapter that does not fit what it read): exit 3 naming specparity's file:line, never
# the engine's fault nor the deployment's
INTERNAL_ERROR = "internal_error"
# vLLM's tap in a server disarmed itself (serving/vllm/tap.py): it held more than its bound between two drains
# (``tap_overflow``), or the gate did not drain within the lease it set at arming (``tap_lease_expired``); the
# evidence of the run is incomplete: the machine's, exit 3
TAP_OVERFLOW = "tap_overflow"
TAP_LEASE_EXPIRED = "tap_lease_expired"
# the probe's own prefill could not be told apart from other requests' rows in the fc calls (a prefix another
# request cached, a prompt never seen whole, or no token ids recorded; on SGLang a radix-cache hit after a refused
# flush): never a verdict on someone else's rows, exit 3
PROBE_NOT_ISOLATED = "probe_not_isolated"
FAILURE_KINDS = (
    FC_NOT_CALLED,
    CAPTURE_COUNT_SHORT,
    CAPTURE_SHAPE,
    SGLANG_EXCEPTION,
    NONFINITE,
    TIMEOUT,
    SGLANG_MISSING,
    UNSUPPORTED_VERSION,
    BAD_DEPLOYMENT,
    CHILD_CRASHED,
    DRAFT_UNREADABLE,
    VLLM_EXCEPTION,
    VLLM_MISSING,
    NEEDS_HARDWARE,
    RANK_MISSING,
    SERVER_FAILED,
    SERVER_UNREACHABLE,
    HOOKS_MISSING,
    NODE_MISSING,
    ENGINE_IMPORT,
    INTERNAL_ERROR,
    TAP_OVERFLOW,
    TAP_LEASE_EXPIRED,
    PROBE_NOT_ISOLATED,
)
ENGINES = ("sglang", "vllm")


# ServerArgs keywords of the speculative triple, in SpecSettings field order (every SGLang version).
SPEC_SERVER_ARGS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


@dataclass(frozen=True)
class SpecSettings:
    """The speculative-decoding triple; ``None`` where unset."""

    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_steps": self.num_steps,
            "eagle_topk": self.eagle_topk,
            "num_draft_tokens": self.num_draft_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpecSettings:
        return cls(
            num_steps=d.get("num_steps"),
            eagle_topk=d.get("eagle_topk"),
            num_draft_tokens=d.get("num_draft_tokens"),
        )


@dataclass(frozen=True)
class ResolvedDeployment:
    """What the engine resolved for one (target, draft, engine args) deployment, read from the engine itself.

    ``layers_to_capture`` are SGLang boundary indices (provenance); ``served_sources`` are the same
    positions in canonical names, in fc-chunk order (ascending, deduplicated, reachable only).
    ``resolved_spec`` comes from ``resolved_view()`` (sglang >= 0.5.19 keeps the user's value on the
    ServerArgs attribute, domain.md §5). ``draft_config_ids`` is ``None`` when SGLang took its default
    path; ``ids_fallback_reason`` then says why.
    """

    engine_version: str  # the release of ``engine`` that resolved it
    adapter: str
    target_path: str
    draft_path: str
    device: str
    target_architecture: str
    num_layers: int
    target_hidden_size: int
    target_vocab_size: int
    target_dtype: str
    draft_architecture: str
    draft_hidden_size: int
    draft_vocab_size: int | None
    requested_spec: SpecSettings
    resolved_spec: SpecSettings
    spec_warnings: tuple[str, ...]
    draft_config_ids: tuple[int, ...] | None
    ids_fallback_reason: str | None
    layers_to_capture: tuple[int, ...]
    served_sources: tuple[str, ...]
    fc_in_features: int
    fc_out_features: int
    fc_bias: bool
    num_aux_hidden_states: int
    fc_applied: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    fc_bias_in_config: bool
    server_args: dict[str, object]
    timings: dict[str, float]
    unreachable_boundaries: tuple[int, ...] = ()  # in layers_to_capture but never reached by the layer loop
    # where fc_in/out/bias came from: "checkpoint" (static resolve), "sglang_module" (live drafter), or
    # "config: no fc.weight in checkpoint" (SGLang would serve a randomly initialised fc)
    fc_source: str = "checkpoint"
    # static level on real objects (serving/sglang/since_0_5_11/static.py): the dotted module path that holds
    # layers_to_capture ("model", "language_model.model"), the draft class SGLang constructs and its fc
    # module (in, out, bias), and notes on how the deployment was resolved
    capture_owner: str = ""
    draft_model_class: str = ""
    draft_fc_module: tuple[int | None, int | None, bool | None] | None = None
    notes: tuple[str, ...] = ()
    # what the adapter family knows about this version that the report must say, as
    # (kind, severity, message, cite): untested_version, draft_ids_ignored (family A), cuda_graph_ids_hazard (B)
    adapter_notes: tuple[tuple[str, str, str, str], ...] = ()
    # which engine resolved this ("sglang" | "vllm"); ``engine_version`` is its release
    engine: str = "sglang"
    # the child's own environment, as it imported it (worker.child_environment): python, sglang and its
    # path, torch, transformers, device; reports name it, so a --python run shows what it measured
    environment: dict[str, str] = field(default_factory=dict)
    # stand-ins active in the child (serving/stand_ins.py, README "Stand-ins"); reports list them
    stand_ins: tuple[str, ...] = ()
    # norm flags this SGLang's drafter cannot apply at all (0.4.10/0.5.3 build no norm modules, D5), and the
    # ones the draft config sets that it therefore ignores
    unsupported_norms: tuple[str, ...] = ()
    ignored_norm_config: tuple[str, ...] = ()
    # the setter code that stored layers_to_capture, cited from the installed release while it ran
    # (serving/sglang/setter_source.py): (function, file under the sglang package, first line, last line, source
    # text), outermost first (a delegating wrapper, then the language model's setter); empty where not recorded
    capture_rule_source: tuple[tuple[str, str, int, int, str], ...] = ()
    # False where the release reads no draft ids at all (family A, D1: its setter takes none); the ids the draft
    # config sets are then ``ignored_config_ids`` (None: it sets none), and ``draft_config_ids`` stays None
    ids_read: bool = True
    ignored_config_ids: tuple[int, ...] | None = None
    # the served layout as the engine resolved it: engine, executor, TP/PP/DP/EP sizes, the ranks expected, and after
    # a capture which ranks reported, from which nodes (serving/vllm/ranks.py layout; report/layout.py renders it)
    layout: dict[str, Any] = field(default_factory=dict)
    # the target's load measured against its checkpoint while the engine loaded it (serving/sglang/load_check.py):
    # the engine's load_weights and its file:line, the parameters it never loaded and the checkpoint tensors it
    # skipped; empty where not measured (the static level, a live server, a family that does not measure it)
    target_load: dict[str, Any] = field(default_factory=dict)
    # the drafter's family (specparity.drafters: eagle3, eagle3-mla, dflash) and the speculative algorithm the engine
    # resolved it under (SGLang's speculative_algorithm, vLLM's speculative_config.method)
    drafter_family: str = "eagle3"
    speculative_algorithm: str = ""
    # a block-diffusion drafter's block size as the engine resolved it (DFlash); None for an EAGLE-3 head
    block_size: int | None = None
    # engine environment switches that choose which residual stream the aux states come from, as the engine read
    # them in the child: name -> {"value", "default", "applies", "cite"} (serving/aux_env.py)
    aux_env: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, SpecSettings):
                out[f.name] = v.to_dict()
            elif isinstance(v, tuple):
                out[f.name] = [list(x) if isinstance(x, tuple) else x for x in v]
            elif isinstance(v, dict):
                out[f.name] = dict(v)
            else:
                out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResolvedDeployment:
        if "engine_version" not in d and "sglang_version" in d:  # the field's old name (a child of an older specparity)
            d = {**d, "engine_version": d["sglang_version"]}
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue  # optional fields with defaults
            v = d[f.name]
            if f.name in ("requested_spec", "resolved_spec"):
                v = SpecSettings.from_dict(v)
            elif f.name in ("draft_config_ids", "ignored_config_ids"):
                v = None if v is None else tuple(int(x) for x in v)
            elif f.name == "capture_rule_source":
                v = tuple((str(a), str(b), int(c), int(d), str(e)) for a, b, c, d, e in v)
            elif f.name in ("layers_to_capture", "unreachable_boundaries"):
                v = tuple(int(x) for x in v)
            elif f.name in ("spec_warnings", "served_sources", "notes", "stand_ins", "unsupported_norms",
                            "ignored_norm_config"):
                v = tuple(str(x) for x in v)
            elif f.name == "draft_fc_module":
                v = None if v is None else tuple(v)
            elif f.name in ("server_args", "timings", "environment", "layout", "target_load", "aux_env"):
                v = dict(v)
            elif f.name == "adapter_notes":
                v = tuple((str(a), str(b), str(c), str(d)) for a, b, c, d in v)
            kw[f.name] = v
        return cls(**kw)


@dataclass(frozen=True)
class ServingFailure:
    """A typed reason why the adapter could not produce (a trustworthy) capture.

    ``kind`` is one of :data:`FAILURE_KINDS`. For ``sglang_exception`` the message quotes SGLang's
    exception type and message and the innermost sglang ``file:line`` of the traceback.
    """

    kind: str
    message: str
    sample: int | None = None
    engine_version: str | None = None  # the engine release that failed, stamped by the child (transport.py)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message, "sample": self.sample}
        if self.engine_version is not None:
            out["engine_version"] = self.engine_version
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServingFailure:
        return cls(kind=str(d["kind"]), message=str(d["message"]), sample=d.get("sample"),
                   engine_version=d.get("engine_version"))

    def __str__(self) -> str:
        where = f" (sample {self.sample})" if self.sample is not None else ""
        return f"{self.kind}{where}: {self.message}"


@dataclass
class FcCapture:
    """What the engine fed the drafter's ``fc``, per probe sample: tensors ``[T_i, k*H_t]``.

    Row ``t`` belongs to token ``t`` of the sample (no shift, domain.md §1). ``per_sample`` is the fc
    input as the forward pre-hook saw it (after ``norm_before_fc``/``fc_norm`` when those are on);
    ``aux_per_sample`` is the target's packed aux hidden states as SGLang produced them (before any
    drafter norm). ``kernel_stub_calls`` lists every call into the ``sgl_kernel`` stand-in.
    """

    per_sample: list[torch.Tensor]
    dtype: str
    engine_version: str
    hook_calls: int
    aux_states_captured: int
    aux_states_expected: int
    kernel_stub_calls: tuple[str, ...]
    aux_per_sample: list[torch.Tensor] = field(default_factory=list)
    kernel_stub_active: bool = False

    def meta_dict(self) -> dict[str, Any]:
        """The JSON part (everything but the tensors)."""
        tensors = ("per_sample", "aux_per_sample")
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in tensors}
        # the tuple as a JSON list, in its field's place; then the sample count
        return meta | {"kernel_stub_calls": list(self.kernel_stub_calls), "num_samples": len(self.per_sample)}


@dataclass
class LayerAtlas:
    """The target's residual stream per probe sample: source name -> ``[T_i, H_t]``.

    Boundaries ``embedding``, ``layer:0`` .. ``layer:L-2`` (pre-norm) and ``final_norm``, plus
    ``layer:L-1`` where the class's layer loop reaches boundary ``L`` (gpt_oss from sglang 0.5.17); a
    llama-style loop never does, so there it is absent.
    """

    per_sample: list[dict[str, torch.Tensor]]
    num_layers: int
    # the default evidence (compare/reduced.py): per sample, the scan's statistics reduced where the atlas was;
    # ``per_sample`` then holds only what else is read in full (the final norm, for the outcome)
    reduced: list[ReducedSample] | None = None

    def sources(self) -> tuple[str, ...]:
        return tuple(self.per_sample[0]) if self.per_sample else ()


@dataclass(frozen=True)
class OutcomeRequest:
    """What the outcome level asks of the same engine run as the capture (one engine start per gate run).

    Each engine takes what it can use: ``recorded_fc[i]`` (probe ``i``'s recorded fc input ``[T_i, k*H_t]``,
    row t = token t) for an engine that replays its own drafter on it (SGLang), ``prompt_lengths[i]`` (the
    probe's rows before the assistant's first token; None where the probe pack does not say, i.e. has no
    loss mask) for an engine whose real serving loop generates from there (vLLM).
    """

    recorded_fc: tuple[torch.Tensor, ...]
    prompt_lengths: tuple[int | None, ...]


@dataclass(frozen=True)
class DrafterReplay:
    """The engine's own drafter on the served and the recorded fc inputs, in the capture's run.

    First-draft logits (draft vocab, float32) per probe sample ``[T, V_d]``; ``hot_token_id`` is the
    engine's draft -> target id map (``d2t + arange``; None = identity); ``passes`` the hook counts per pass.
    """

    served_logits: list[torch.Tensor]
    recorded_logits: list[torch.Tensor]
    hot_token_id: torch.Tensor | None
    passes: Mapping[str, Any]

    def first_drafts(self, side: str) -> list[torch.Tensor]:
        """The engine's ``d_1`` per row of each sample, in target ids; ``side`` is ``served`` or ``recorded``.

        `# sglang 0.5.23 speculative/eagle_worker_v2.py:757-758` maps draft ids through ``hot_token_id``."""
        logits = self.served_logits if side == "served" else self.recorded_logits
        ids = [x.argmax(dim=-1) for x in logits]
        return ids if self.hot_token_id is None else [self.hot_token_id[i] for i in ids]


@dataclass(frozen=True)
class LoopAcceptance:
    """What the engine's own serving loop counted: drafts, and how many were accepted at each draft position."""

    engine: str
    drafts: int
    accepted_per_position: tuple[int, ...]
    accepted: int
    draft_tokens: int | None = None
    tensor_parallel_size: int | None = None
    prompts: str | None = None  # "assistant_start": the loop ran on the probes' prompts; else after each probe


@dataclass
class CaptureResult:
    """Everything one capture produced. Never empty-and-silent: ``fc is None`` implies a failure."""

    deployment: ResolvedDeployment | None
    fc: FcCapture | None
    atlas: LayerAtlas | None
    failures: tuple[ServingFailure, ...]
    # what the engine's own serving loop reported, raw (vLLM: its spec-decode counters and per-rank facts)
    loop: dict[str, Any] | None = None
    # the outcome evidence of the same run (asked by an OutcomeRequest): the engine's own drafter replay, or
    # why there is none; and the acceptance its serving loop counted. Neither is a capture failure.
    replay: DrafterReplay | ServingFailure | None = None
    acceptance: LoopAcceptance | None = None

    def __post_init__(self) -> None:
        if self.fc is None and not self.failures:
            raise ValueError("CaptureResult without an fc capture must carry at least one ServingFailure")

    @property
    def ok(self) -> bool:
        """True when the fc input was captured and no failure was recorded."""
        return self.fc is not None and not self.failures

    def failure_kinds(self) -> tuple[str, ...]:
        return tuple(f.kind for f in self.failures)


@dataclass(frozen=True)
class IdReading:
    """What an engine makes of a draft config's aux ids: the ids, their key, and the sources they serve."""

    ids: tuple[int, ...] | None
    key: str | None
    sources: tuple[str, ...]
    rule: str  # one line, with the engine file:line it follows


@dataclass(frozen=True)
class Explanation:
    """``specparity explain``'s answer to "what will the engine feed fc?", as one JSON-able record: the exit code
    (0 resolved, 1 refused or not served as configured, 2 bad input, 3 not computable here), a summary line, the
    JSON ``data`` and the terminal ``lines``."""

    exit_code: int
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    lines: tuple[str, ...] = ()
