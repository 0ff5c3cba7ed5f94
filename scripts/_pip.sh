# Shared by scripts/venv.sh, venv-sglang.sh and venv-vllm.sh (sourced): pinned installs through a wheelhouse.
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
