#!/usr/bin/env bash
# Build (or reuse) the venv of one old SGLang version for the test matrix.
#
#   scripts/venv-sglang.sh 0.5.3          -> .tox/sglang-0.5.3
#   scripts/venv-sglang.sh 0.4.10.post2   -> .tox/sglang-0.4.10      (0.4.10 is accepted too)
#   scripts/venv-sglang.sh 0.5.3 DIR      -> DIR (tox passes its own env dir)
#
# Every package is pinned and installed --no-deps: sglang's own dependency set pulls CUDA-only packages
# (sgl-kernel, flashinfer), so the lists in constraints/ are the whole environment:
#   constraints/torch-cpu-2.13.txt           torch 2.13.0 CPU build (no torchvision: its PyPI wheels need CUDA torch)
#   constraints/sglang-<version>.txt         the frozen runtime list + sglang itself
#   constraints/dev.txt                      pytest, hypothesis, deepdiff, ... (shared with .venv)
# then specparity itself, editable. Idempotent: a stamp holds the hash of every input; a matching stamp
# means nothing to do. pip's cache (~/.cache/pip) makes a rebuild fast.
# sglang 0.5.23 lives in .venv (scripts/venv.sh); this script is for the older families only.
# torch 2.13.0+cpu is not on PyPI: set SPECPARITY_TORCH_INDEX=https://download.pytorch.org/whl/cpu
# where no local wheel/index provides it.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/venv-sglang.sh {0.5.3|0.4.10.post2} [VENV_DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in
  0.5.3) version=0.5.3; name=sglang-0.5.3 ;;
  0.4.10|0.4.10.post2) version=0.4.10.post2; name=sglang-0.4.10 ;;
  *) echo "venv-sglang.sh: no pinned list for sglang $1 (supported here: 0.5.3, 0.4.10.post2;" \
          "0.5.23 is .venv, built by scripts/venv.sh)" >&2; exit 2 ;;
esac
VENV=${2:-.tox/$name}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
inputs="constraints/torch-cpu-2.13.txt constraints/sglang-$version.txt constraints/dev.txt pyproject.toml scripts/venv-sglang.sh"
stamp=$(cat $inputs | sha256sum | cut -c1-16)
if [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
echo "specparity: preparing $VENV for sglang $version (first time: a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
torch_index=()
[ -n "${SPECPARITY_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$SPECPARITY_TORCH_INDEX")
pip install --no-deps "${torch_index[@]}" -r constraints/torch-cpu-2.13.txt
pip install --no-deps -r "constraints/sglang-$version.txt"
pip install --no-deps -r constraints/dev.txt
pip install --no-deps -e .
"$VENV/bin/python" -c "import importlib.metadata as m; v = m.version('sglang'); assert v == '$version', v"
echo "$stamp" > "$VENV/.specparity-stamp"
echo "specparity: $VENV ready in $(( $(date +%s) - start )) s" >&2
