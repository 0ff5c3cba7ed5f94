"""Env layers (scripts/_pip.sh): a venv's pinned packages kept once outside the clone, hard-linked into fresh venvs.

Runs the shell functions themselves on a small venv: the key follows the lists' bytes, a restored venv holds the
layer's files as hard links (the layer untouched), and its console scripts run under the new venv's interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _sh(script: str, tmp: Path) -> str:
    env = {**os.environ, "SPECPARITY_ENV_LAYERS": str(tmp / "layers")}
    proc = subprocess.run(["bash", "-c", f". scripts/_pip.sh\n{script}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_key_follows_the_lists_bytes_and_the_options(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("sglang==0.5.14\n")
    b.write_text("pytest==9.0.0\n")
    py = sys.executable
    key = _sh(f"env_layer_key {py} {a} {b}", tmp_path)
    assert key == _sh(f"env_layer_key {py} {a} {b}", tmp_path) and len(key) == 16
    assert key != _sh(f"env_layer_key {py} {a} {b} -- --extra-index-url x", tmp_path)
    assert key != _sh(f"env_layer_key {py} {b} {a}", tmp_path)  # the lists' order is the install order
    a.write_text("sglang==0.5.15\n")
    assert key != _sh(f"env_layer_key {py} {a} {b}", tmp_path)


def test_a_restored_venv_links_the_layers_files_and_rewrites_its_scripts(tmp_path: Path) -> None:
    built, restored = tmp_path / "built", tmp_path / "restored"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(built)], check=True)
    site = Path(subprocess.check_output([str(built / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "pinned_pkg.py").write_text("VALUE = 7\n")
    (built / "lib" / "libdata.so").write_bytes(b"data files land outside site-packages")  # as intel-openmp's
    tool = built / "bin" / "pinned-tool"
    tool.write_text(f"#!{built}/bin/python\nimport pinned_pkg\nprint(pinned_pkg.VALUE)\n")
    tool.chmod(0o755)
    _sh(f"env_layer_save {built} k1", tmp_path)
    layer = tmp_path / "layers" / "k1"
    assert (layer / ".complete").exists()

    _sh(f"env_layer_restore {sys.executable} {restored} k1", tmp_path)
    new_site = Path(subprocess.check_output([str(restored / "bin" / "python"), "-c",
                                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                            text=True).strip())
    in_layer = layer / "root" / site.relative_to(built) / "pinned_pkg.py"
    assert (new_site / "pinned_pkg.py").stat().st_ino == in_layer.stat().st_ino
    assert (restored / "lib" / "libdata.so").read_bytes() == (built / "lib" / "libdata.so").read_bytes()
    script = restored / "bin" / "pinned-tool"
    assert script.read_text().splitlines()[0] == f"#!{restored.resolve()}/bin/python"
    assert subprocess.check_output([str(script)], text=True).strip() == "7"
    assert (layer / "bin" / "pinned-tool").read_text().splitlines()[0] == f"#!{built}/bin/python"  # untouched
    # no layer under that key: nothing is done and the caller builds
    env = {**os.environ, "SPECPARITY_ENV_LAYERS": str(tmp_path / "layers")}
    proc = subprocess.run(["bash", "-c", f". scripts/_pip.sh\nenv_layer_restore {sys.executable} {tmp_path / 'x'} nokey"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and not (tmp_path / "x").exists()
