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
