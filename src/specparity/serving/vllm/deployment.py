"""The deployment as vLLM resolved it, from its own ``VllmConfig``: in the gate's child after ``EngineArgs`` resolved
the request (``serving/vllm/worker.py``), or inside a running server's worker (the tap's describe RPC,
``serving/vllm/tap.py``). Imported only where vLLM is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _hf_dict(cfg: Any) -> dict[str, Any]:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
    return {k: v for k, v in d.items() if not k.startswith("_")}


def text_config_of(model_config: Any) -> Any:
    """The config that holds a target's text sizes: vLLM's own ``hf_text_config`` (a multimodal or nested config's
    ``text_config``, ``transformers_utils/config.py`` get_hf_text_config), else the config itself."""
    return getattr(model_config, "hf_text_config", None) or model_config.hf_config


def total_layers(model_config: Any) -> int:
    """The target's layer count as the release counts it: ``ModelConfig.get_total_num_hidden_layers`` where the release
    has it (0.17.1 does), else its text config's ``num_hidden_layers``, what 0.11.0's ``get_layers_start_end_indices``
    counts for a target (config/model.py:1197-1212)."""
    get = getattr(model_config, "get_total_num_hidden_layers", None)
    if get is not None:
        return int(get())
    return int(getattr(text_config_of(model_config), "num_hidden_layers", 0))


def fallback_reason(raw: dict[str, Any], parsed: dict[str, Any], boundaries: list[int], *,
                    version: str = "0.32.0") -> str:
    """Why vLLM took its default: the draft config's exact shape (idrules/vllm_shapes.py) for the keys the release
    reads, as written, else as vLLM parsed it (a speculators config is translated first)."""
    from specparity.idrules.vllm import READ_PATHS
    from specparity.idrules.vllm_releases import code_of, reader_rule
    from specparity.idrules.vllm_shapes import fallback_shape

    reads = READ_PATHS[reader_rule(version).name]
    found = fallback_shape(raw, reads=reads) or fallback_shape(parsed, reads=reads)
    what = f"{found.shape}: {found.message}" if found else "vLLM's reader returned no ids"
    return (f"vLLM read no aux layer ids ({what}) and serves its model default (2, L//2, L-3) = boundaries "
            f"{boundaries} (vllm {version} {code_of(version).default})")


def deployment_from_config(request: Any, vllm_config: Any, kw: dict[str, Any], n_spec: int, *, fc_meta: dict[str, Any] | None,
                timings: dict[str, float], served_layout: dict[str, Any] | None = None) -> Any:
    """A :class:`ResolvedDeployment` from vLLM's own resolved config (and the live fc when given)."""
    import importlib

    import vllm

    from specparity.checkpoint_files import fc_shape_from_checkpoint
    from specparity.idrules.vllm import drafter_aux_count
    from specparity.serving.command.parse_child import json_safe
    from specparity.serving.results import ResolvedDeployment, SpecSettings
    from specparity.serving.vllm.ranks import layout

    mc, sc = vllm_config.model_config, vllm_config.speculative_config
    tcfg = mc.hf_config  # the architecture's own config: a multimodal one keeps its sizes in a text config
    text = text_config_of(mc)
    num_layers = total_layers(mc)
    hidden = int(getattr(text, "hidden_size", None) or mc.get_hidden_size())
    dcfg = _hf_dict(sc.draft_model_config.hf_config) if sc is not None else {}

    from specparity.serving.vllm.families import adapter_module, family_for

    selected = family_for(str(vllm.__version__))
    # the release's own reader, through its family's adapter folder (serving/vllm/families.py)
    reader = importlib.import_module(adapter_module(selected.family))
    if sc is not None and getattr(sc, "method", None) == "dspark":
        # vLLM serves DSpark only through its V2 model runner (0.32 v1/worker/gpu/spec_decode/__init__.py:45-50),
        # whose reader (0.32 v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:100-140, via set_eagle3_aux_hidden_state_layers
        # at v1/worker/gpu/model_runner.py:405-407) reads DSpark's ids: the V2 family's adapter asks it
        reader = importlib.import_module("specparity.serving.vllm.since_0_34.reader")
    read = reader.vllm_reading(sc) if sc is not None else None
    notes: list[tuple[str, str, str, str]] = []
    if selected.untested:
        notes.append(("untested_version", "warning",
                      f"vllm {vllm.__version__} is newer than every release specparity's vLLM rules were read at "
                      f"(idrules/vllm_releases.py): served by family {selected.family.letter}'s adapter "
                      f"({selected.family.folder}) and the newest id rules, untested on it",
                      "serving/vllm/families.py"))
    try:
        raw = json.loads((Path(request.draft) / "config.json").read_text())
    except (OSError, ValueError):
        raw = {}
    boundaries, reason = _boundaries(read, raw, dcfg, num_layers, version=str(vllm.__version__))
    from specparity.sources import boundary_to_source

    reachable = tuple(b for b in boundaries if 0 <= b <= num_layers)
    shape = fc_shape_from_checkpoint(Path(request.draft))
    k = drafter_aux_count(dcfg)
    fc_in, fc_out, bias, source = _fc_facts(fc_meta, shape, dcfg, hidden, k)
    nested = dcfg.get("eagle_config")
    eagle: dict[str, Any] = nested if isinstance(nested, dict) else {}
    spec = SpecSettings(num_steps=n_spec, eagle_topk=None, num_draft_tokens=None)
    resolved = SpecSettings(num_steps=int(sc.num_speculative_tokens), eagle_topk=1,
                            num_draft_tokens=int(sc.num_speculative_tokens) + 1) if sc is not None else spec
    return ResolvedDeployment(
        engine_version=vllm.__version__, adapter=f"vllm-family-{selected.family.letter}", target_path=request.target,
        draft_path=request.draft, adapter_notes=tuple(notes),
        device=request.device, target_architecture=str((getattr(tcfg, "architectures", None) or ["?"])[0]),
        num_layers=num_layers, target_hidden_size=hidden, target_vocab_size=int(mc.get_vocab_size()),
        target_dtype=str(mc.dtype).removeprefix("torch."),
        # as the draft's config.json names it (vLLM maps a speculators config to its own class)
        draft_architecture=str((raw.get("architectures") or dcfg.get("architectures") or ["?"])[0]),
        draft_hidden_size=int(dcfg.get("hidden_size") or 0),
        # a draft config without draft_vocab_size drafts in its vocab_size: each drafter class sets it so when built
        # (vllm 0.32 models/llama_eagle3.py:314-316, deepseek_eagle3.py:283-285, qwen3_dflash.py:780-781)
        draft_vocab_size=dcfg.get("draft_vocab_size") or dcfg.get("vocab_size"), requested_spec=spec, resolved_spec=resolved, spec_warnings=(),
        draft_config_ids=tuple(int(b) for b in read) if read else None, ids_fallback_reason=reason,
        layers_to_capture=boundaries, served_sources=tuple(boundary_to_source(b, num_layers) for b in reachable),
        fc_in_features=fc_in, fc_out_features=fc_out, fc_bias=bias, num_aux_hidden_states=k, fc_applied=True,
        norm_before_fc=bool(dcfg.get("norm_before_fc") or eagle.get("norm_before_fc")),
        fc_norm=bool(dcfg.get("fc_norm")), norm_output=bool(dcfg.get("norm_output")),
        fc_bias_in_config=bool(dcfg.get("bias", False)),
        # the report's plain view (a config object as the fields it sets, an enum as its value)
        server_args={k2: json_safe(v) for k2, v in kw.items() if k2 not in ("model", "speculative_config")},
        timings=timings, unreachable_boundaries=tuple(b for b in boundaries if b not in reachable),
        fc_source=source, engine="vllm", layout=served_layout or layout(vllm_config.parallel_config, None),
    )


def _boundaries(read: Any, raw: Any, dcfg: dict[str, Any], num_layers: int, *,
                version: str) -> tuple[tuple[int, ...], str | None]:
    """The boundaries the release's own reader gives (``read``), else vLLM's default ones and why the draft's ids
    were not read."""
    if read:
        return tuple(sorted(set(int(b) for b in read))), None
    boundaries = tuple(sorted({2, num_layers // 2, num_layers - 3}))  # interfaces.py:1712-1733
    return boundaries, fallback_reason(raw if isinstance(raw, dict) else {}, dcfg, list(boundaries), version=version)


def _fc_facts(fc_meta: dict[str, Any] | None, shape: Any, dcfg: dict[str, Any], hidden: int,
              k: int) -> tuple[int, int, bool, str]:
    """fc's (in, out, bias) and where they come from: the live module's, else the checkpoint's, else the config's
    ``k`` target hidden states in."""
    if fc_meta is not None:
        return (int(fc_meta["in_features"]), int(fc_meta["out_features"]), bool(fc_meta["bias"]), "vllm_module")
    if shape is not None:
        return shape.in_features, shape.out_features, shape.bias, "checkpoint"
    t_hidden = int(dcfg.get("target_hidden_size") or dcfg.get("hidden_size") or hidden)
    return (t_hidden * k, int(dcfg.get("hidden_size") or 0), bool(dcfg.get("bias", False)),
            "config: no fc.weight in checkpoint")


def describe_config(vllm_config: Any) -> dict[str, Any]:
    """The deployment a running vLLM resolved, from its own ``VllmConfig`` (a server's worker, through the tap's
    :data:`~specparity.serving.vllm.tap_wire.DESCRIBE` RPC), as ResolvedDeployment JSON."""
    from types import SimpleNamespace

    from specparity.serving.vllm.ranks import layout

    mc, sc = vllm_config.model_config, vllm_config.speculative_config
    device = str(getattr(vllm_config.device_config, "device_type", None) or "cpu")
    where = SimpleNamespace(target=str(mc.model), draft=str(sc.model) if sc is not None else "", device=device)
    n_spec = int(sc.num_speculative_tokens) if sc is not None else 0
    served = {"dtype": str(mc.dtype).removeprefix("torch."), "max_model_len": int(mc.max_model_len),
              "enforce_eager": bool(mc.enforce_eager), "quantization": mc.quantization,
              "tensor_parallel_size": int(vllm_config.parallel_config.tensor_parallel_size),
              "pipeline_parallel_size": int(vllm_config.parallel_config.pipeline_parallel_size),
              "speculative_method": getattr(sc, "method", None) if sc is not None else None}
    dep = deployment_from_config(where, vllm_config, served, n_spec, fc_meta=None, timings={},
                      served_layout=layout(vllm_config.parallel_config, None))
    return dict(dep.to_dict())
