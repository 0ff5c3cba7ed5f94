#!/usr/bin/env bash
# Build (or reuse) the venv of one SGLang version for the test matrix; any supported version works.
#
#   scripts/venv-sglang.sh 0.5.14         -> .tox/sglang-0.5.14        (constraints/sglang-0.5.14.txt)
#   scripts/venv-sglang.sh 0.4.10.post2   -> .tox/sglang-0.4.10        (0.4.10 is accepted too)
#   scripts/venv-sglang.sh 0.5.12         -> .tox/sglang-0.5.12        (family C's list, sglang pin replaced)
#   scripts/venv-sglang.sh 0.5.3 DIR      -> DIR (tox passes its own env dir)
#
# The version's family and representative list come from src/specparity/serving/sglang/families.py (the
# adapter registry's own table). Every package is pinned and installed --no-deps: sglang's own dependency
# set pulls CUDA-only packages (sgl-kernel, flashinfer), so the lists in constraints/ are the whole env:
#   torch list          families.py's MatrixEnv.torch: constraints/torch-cpu-2.13.txt (installed --no-deps), or
#                       constraints/torch-0.5.23.txt (CUDA torch 2.14.1, runs on CPU; needed from 0.5.11, whose
#                       torchvision import needs CUDA torch), installed with its nvidia-* deps as scripts/venv.sh does
#   constraints/sglang-<version>.txt    the frozen runtime list + sglang itself
#   constraints/dev.txt                 pytest, hypothesis, deepdiff, ... (shared with .venv)
# then specparity itself, editable. Idempotent: a stamp holds the hash of every input; a matching stamp
# means nothing to do. pip's cache (~/.cache/pip, outside the clone) makes a rebuild fast.
# For a version with no list of its own, the family's representative list is used with the sglang pin
# replaced; its other pins are the representative's (what the matrix tests), so that env is best-effort.
# torch 2.13.0+cpu is not on PyPI: set SPECPARITY_TORCH_INDEX to an index that has it where no local
# wheel/index provides it.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: scripts/venv-sglang.sh VERSION [VENV_DIR]   (any SGLang from 0.4.4.post2)" >&2; exit 2; }
[ $# -ge 1 ] || usage
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
version=$1
[ "$version" = 0.4.10 ] && version=0.4.10.post2
# families.py needs only `packaging` (python3.11 and every venv here have it).
read -r env_name env_sglang list torch_list family < <("$PY" src/specparity/serving/sglang/families.py env-for "$version") \
  || { echo "venv-sglang.sh: sglang $version cannot be built (see above)" >&2; exit 2; }
if [ "$env_sglang" = "$version" ]; then
  name=$env_name
else
  name=sglang-$version
fi
[ -f "$list" ] || { echo "venv-sglang.sh: $list is missing (family $family)" >&2; exit 2; }
VENV=${2:-.tox/$name}
inputs="$torch_list $list constraints/dev.txt pyproject.toml scripts/venv-sglang.sh src/specparity/serving/sglang/families.py"
stamp=$( (cat $inputs; echo "$version") | sha256sum | cut -c1-16)
if [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
echo "specparity: preparing $VENV for sglang $version (family $family, $list; first time: a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
torch_index=()
[ -n "${SPECPARITY_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$SPECPARITY_TORCH_INDEX")
. scripts/_pip.sh  # torch_layer: torch shared by hard links; pinned_install: the lists through a wheelhouse
if grep -v '^#' "$torch_list" | grep -q '+cpu'; then  # comments may name the CPU build
  torch_layer "$VENV/bin/python" "$torch_list" --no-deps "${torch_index[@]}"
else  # a CUDA build needs its nvidia-* libraries to import, even on CPU
  torch_layer "$VENV/bin/python" "$torch_list" "${torch_index[@]}"
fi
if [ "$env_sglang" = "$version" ]; then
  pinned_install "$VENV/bin/python" "$list"
else
  tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
  sed "s/^sglang==.*/sglang==$version/" "$list" > "$tmp"
  pinned_install "$VENV/bin/python" "$tmp"
fi
pinned_install "$VENV/bin/python" constraints/dev.txt
pip install --no-deps -e .
"$VENV/bin/python" -c "import importlib.metadata as m; v = m.version('sglang'); assert v == '$version', v"
echo "$stamp" > "$VENV/.specparity-stamp"
echo "specparity: $VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
