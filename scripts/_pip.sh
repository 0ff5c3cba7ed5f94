# Shared by scripts/venv.sh, venv-engine.sh and dist.sh (sourced): pinned installs through a wheelhouse.
#
# pip's own HTTP cache stores nothing on this network (PyPI's responses arrive without Cache-Control, ETag or
# Last-Modified, so pip's cache layer keeps none of them), and the matrix lists share most of their pins. So
# every wheel fetched from PyPI is kept once in a wheelhouse outside the clone, keyed by its file name (pinned
# versions: safe to reuse), and every later install of a list that is complete there needs no network:
#   SPECPARITY_WHEELHOUSE   default ${XDG_CACHE_HOME:-~/.cache}/specparity/wheels
# torch lists are not routed through it: their wheels lie on local disk (find-links) and are several GB.
WHEELHOUSE=${SPECPARITY_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/specparity/wheels}

# pinned_install PYTHON LIST [pip options]: `pip install --no-deps -r LIST` from the wheelhouse, filling it first
# with whatever the list needs that it lacks (sdists are built into wheels once).
pinned_install() {
  local py=$1 list=$2
  shift 2
  mkdir -p "$WHEELHOUSE"
  local from_house=("$py" -m pip -q --disable-pip-version-check install --no-deps --no-index --find-links "$WHEELHOUSE")
  if "${from_house[@]}" "$@" -r "$list" >/dev/null 2>&1; then
    return 0
  fi
  "$py" -m pip -q --disable-pip-version-check wheel --no-deps --wheel-dir "$WHEELHOUSE" --find-links "$WHEELHOUSE" \
    "$@" -r "$list" && "${from_house[@]}" "$@" -r "$list"
}

# torch_layer PYTHON LIST [pip options]: the torch list installed once into a shared layer
# (`pip install --target`, keyed by the list, the options and the Python), then hard-linked into the venv's
# site-packages. Every CUDA-torch env (.venv, sglang 0.5.10/0.5.14/0.5.20) holds the same 5.5 GB of torch and
# nvidia-* libraries; linked, they cost one install and no extra disk, and each env still imports them from its
# own site-packages. A layer is complete or absent (built aside, then renamed); a copy replaces links where the
# layer lies on another filesystem.
#   SPECPARITY_TORCH_LAYERS   default ${XDG_CACHE_HOME:-~/.cache}/specparity/torch-layers
TORCH_LAYERS=${SPECPARITY_TORCH_LAYERS:-${XDG_CACHE_HOME:-$HOME/.cache}/specparity/torch-layers}
torch_layer() {
  local py=$1 list=$2
  shift 2
  local key layer site entry
  key=$( (cat "$list"; echo "$*"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
  layer="$TORCH_LAYERS/$key"
  if [ ! -f "$layer/.complete" ]; then
    mkdir -p "$TORCH_LAYERS"
    rm -rf "$layer.partial"
    "$py" -m pip -q --disable-pip-version-check install --target "$layer.partial" "$@" -r "$list" || return 1
    touch "$layer.partial/.complete"
    rm -rf "$layer"
    mv "$layer.partial" "$layer"
  fi
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for entry in "$layer"/*; do
    [ "$(basename "$entry")" = bin ] && continue  # console scripts written for the layer's first python
    cp -al --remove-destination "$entry" "$site/" 2>/dev/null || cp -a --remove-destination "$entry" "$site/" || return 1
  done
}

# Env layers: a venv's whole set of pinned packages (for an engine env: the torch layer, the engine's list and
# dev.txt), kept once per set of lists outside the clone and hard-linked into a fresh venv's site-packages by later
# builds. Building an env installs ~50k files through pip (~90 CPU-s on 2 cores, measured for sglang 0.5.14);
# linking them takes ~1 s. Only what the pinned lists install is kept (saved before specparity's editable
# install), keyed by the lists' bytes, the pip options and the Python, so a changed pin is a new layer. The
# lists' console scripts (ruff, mypy, ...) are kept beside them and written back with the new venv's interpreter
# on their first line. A layer is complete or absent.
#   SPECPARITY_ENV_LAYERS   default ${XDG_CACHE_HOME:-~/.cache}/specparity/env-layers
ENV_LAYERS=${SPECPARITY_ENV_LAYERS:-${XDG_CACHE_HOME:-$HOME/.cache}/specparity/env-layers}

# env_layer_key PYTHON LIST... [-- pip options]: the layer's key
env_layer_key() {
  local py=$1
  shift
  local files=() opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do files+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  opts=("$@")
  ( echo "env-layer 3"; for f in "${files[@]}"; do echo "== list"; cat "$f"; done
    echo "${opts[*]:-}"; "$py" -c 'import sys; print(sys.version)' ) | sha256sum | cut -c1-16
}

# env_layer_restore PYTHON VENV KEY: a fresh VENV holding the layer's packages; fails (nothing done) without one
env_layer_restore() {
  local py=$1 venv=$2 layer="$ENV_LAYERS/$3" entry name abs
  [ -f "$layer/.complete" ] || return 1
  "$py" -m venv --clear "$venv" || return 1
  abs=$(cd "$venv" && pwd)
  # site-packages and whatever else the lists installed under the venv (e.g. intel-openmp's lib/libiomp5.so)
  for entry in "$layer/root"/* "$layer/root"/.[!.]*; do
    [ -e "$entry" ] || continue
    cp -al --remove-destination "$entry" "$abs/" 2>/dev/null || cp -a --remove-destination "$entry" "$abs/" || return 1
  done
  for entry in "$layer/bin"/*; do
    [ -f "$entry" ] || continue
    name=$(basename "$entry")
    [ -e "$abs/bin/$name" ] && continue  # the venv's own python, pip and activate scripts
    if [ "$(head -c 2 "$entry")" = "#!" ]; then  # a script: its interpreter is this venv's
      { echo "#!$abs/bin/python"; tail -n +2 "$entry"; } > "$abs/bin/$name" && chmod +x "$abs/bin/$name"
    else
      cp -a "$entry" "$abs/bin/$name" || return 1
    fi
  done
  echo "specparity: $venv from the env layer $layer" >&2
}

# env_layer_save VENV KEY: keep VENV's installed files (all but its interpreter links and pyvenv.cfg) and console
# scripts as the layer KEY (hard links where one filesystem allows)
env_layer_save() {
  local venv=$1 layer="$ENV_LAYERS/$2" entry ok=1
  [ -f "$layer/.complete" ] && return 0
  mkdir -p "$ENV_LAYERS"
  rm -rf "$layer.partial"
  mkdir -p "$layer.partial/root"
  for entry in "$venv"/*; do
    case "$(basename "$entry")" in bin|pyvenv.cfg|lib64) continue ;; esac
    [ -L "$entry" ] && continue
    cp -al "$entry" "$layer.partial/root/" 2>/dev/null || cp -a "$entry" "$layer.partial/root/" || ok=0
  done
  cp -a "$venv/bin" "$layer.partial/bin" || ok=0
  if [ "$ok" != 1 ]; then
    rm -rf "$layer.partial"
    return 0
  fi
  touch "$layer.partial/.complete"
  rm -rf "$layer"
  mv "$layer.partial" "$layer"
}
