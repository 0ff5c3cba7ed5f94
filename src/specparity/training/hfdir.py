"""Readers for Hugging Face style model directories (target and drafter): config, weights, tokenizer.

Weights are read safely: safetensors headers (no tensor data needed for shapes), or
``torch.load(weights_only=True)`` for ``.bin``/``.pt`` files. Pickled code is refused.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specparity.errors import InputError
from specparity.training.tokenizer_fingerprint import tokenizer_fingerprint

# Config fields whose change changes the hidden states a target produces (or how they are indexed).
FINGERPRINT_FIELDS = (
    "architectures",
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "tie_word_embeddings",
)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp32": "float32", "bf16": "bfloat16"}


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 over dtype, shape and raw bytes of ``t`` (stable across file formats)."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", path=path) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object", path=path)
    return data


def safe_torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)``; gzip-aware; pickled code and corrupt files are InputErrors."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(f"cannot read (truncated or not gzip?): {e}", path=path) from None
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        from specparity.checkpoint_files import weights_only_refusal

        raise InputError(f"refused, never unpickled: the file pickles objects other than tensors "
                         f"({weights_only_refusal(e)[:160]})", path=path) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as e:
        raise InputError(f"truncated or corrupt torch file: {str(e).splitlines()[0][:160]}", path=path) from None


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    config: dict[str, Any]
    architecture: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str
    config_fingerprint: str
    tokenizer_fingerprint: str | None
    chat_template_fingerprint: str | None
    pad_token_id: int
    # sha256 of the tokenizer file's bytes: what contracts recorded before tokenizer_fingerprint was semantic
    # (training/tokenizer_fingerprint.py); the gate accepts either
    tokenizer_byte_hash: str | None = None


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # multimodal wrappers keep the language model's fields under text_config
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def _int_field(cfg: dict[str, Any], key: str, path: Path) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise InputError(f"missing or not a positive integer ({v!r})", path=path, field=key)
    return v


def read_target(target: str | Path) -> TargetInfo:
    """Read a target model directory's config.json and tokenizer files (the tokenizer's fingerprint is
    semantic: training/tokenizer_fingerprint.py)."""
    d = Path(target)
    cfg_path = d / "config.json"
    if not d.is_dir():
        raise InputError("target is not a directory", path=d)
    raw = read_json(cfg_path)
    cfg = _text_config(raw)
    archs = raw.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise InputError("missing architectures list", path=cfg_path, field="architectures")
    dtype_raw = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    dtype = _DTYPES.get(str(dtype_raw))
    if dtype is None:
        raise InputError(f"unsupported dtype {dtype_raw!r}", path=cfg_path, field="torch_dtype")
    fp = {k: cfg.get(k) for k in FINGERPRINT_FIELDS}
    tmpl: str | None = None
    tc_path = d / "tokenizer_config.json"
    tok_cfg = read_json(tc_path) if tc_path.is_file() else {}
    tok = tokenizer_fingerprint(d, tok_cfg)
    if isinstance(tok_cfg.get("chat_template"), str):
        tmpl = tok_cfg["chat_template"]
    elif (d / "chat_template.jinja").is_file():
        tmpl = (d / "chat_template.jinja").read_text(encoding="utf-8")
    # SpecForge's collator pads input_ids with 0 when the tokenizer names no pad id (domain.md §4)
    pad = raw.get("pad_token_id", tok_cfg.get("pad_token_id", 0))
    return TargetInfo(
        path=d,
        config=raw,
        architecture=archs[0],
        num_layers=_int_field(cfg, "num_hidden_layers", cfg_path),
        hidden_size=_int_field(cfg, "hidden_size", cfg_path),
        vocab_size=_int_field(cfg, "vocab_size", cfg_path),
        dtype=dtype,
        config_fingerprint=sha256_bytes(json.dumps(fp, sort_keys=True).encode()),
        tokenizer_fingerprint=tok.semantic if tok else None,
        chat_template_fingerprint=sha256_bytes(tmpl.encode()) if tmpl is not None else None,
        pad_token_id=pad if isinstance(pad, int) else 0,
        tokenizer_byte_hash=tok.byte_hash if tok else None,
    )


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: every shard SGLang would load (checkpoint_files.weight_files),
    safetensors, or ``*.bin``/``*.pt`` safe-loaded; trainer state such as ``training_args.bin`` is skipped."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from specparity.checkpoint_files import weight_files

    files = weight_files(directory).files
    if not files:
        raise InputError("no weights found (*.safetensors, or *.bin / *.pt besides trainer state)", path=directory)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            try:
                out.update(load_file(str(f)))
            except (SafetensorError, OSError) as e:
                raise InputError(f"unreadable safetensors file: {e}", path=f) from None
            continue
        data = safe_torch_load(f)
        if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
            raise InputError("expected a dict of tensors", path=f)
        out.update(data)
    return out
