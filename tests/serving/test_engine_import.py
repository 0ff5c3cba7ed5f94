"""An engine that cannot even be imported is this machine's problem, never the deployment's.

SGLang's import makes ``~/.cache`` (sglang 0.5.23 utils/hf_transformers_patches.py:265); with ``HOME`` where no
folder can be made (a read-only HOME in a container, here a path under a regular file, which needs no root) the
import raises. That is ``serving_failure`` ``engine_import``, ``cause`` ``environment``: exit 3 (it was exit 1,
"SGLang refuses the deployment"), cold and from the warm-start zygote alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "fixtures" / "default"
CONTRACT = REPO / "contracts" / "tiny-llama-eagle3.json"

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("warm", ["0", "1"])
def test_an_engine_import_failure_is_exit_3(tmp_path: Path, warm: str, sglang_required: None) -> None:
    (tmp_path / "plain").write_text("a file, so HOME below it cannot be made\n")
    env = {**os.environ, "HOME": str(tmp_path / "plain" / "home"), "SPECPARITY_WARM_START": warm}
    # torch's inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ the first time it makes its cache dir
    # (torch/_inductor/runtime/cache_dir_utils.py:19), so this pytest worker may carry it from an earlier test; a
    # user who sets it has an import that works (and a gate that runs), so it is left out here
    for name in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(name, None)
    report = tmp_path / "r.json"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "specparity"), "gate", "--contract", str(CONTRACT), "--target",
         str(BUNDLE / "target"), "--draft", str(BUNDLE / "draft"), "--level", "static", "--json", str(report)],
        env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "SGLang refuses" not in result.stdout and "writable HOME" in result.stdout
    data = json.loads(report.read_text())
    [finding] = [f for f in data["findings"] if f["details"].get("serving_failure")]
    assert finding["details"]["serving_failure"] == "engine_import"
    assert finding["details"]["cause"] == "environment" and "Not a directory" in finding["message"]
    assert data["verdict"] == "error"
