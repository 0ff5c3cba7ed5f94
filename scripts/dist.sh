#!/usr/bin/env bash
# Build specparity's sdist and wheel with the standard build frontend and check both with twine.
#
#   scripts/dist.sh [OUTDIR]       -> OUTDIR (default dist/): specparity-<v>.tar.gz, specparity-<v>-py3-none-any.whl
#
# The tools live in their own env, .tox/dist (constraints/dist.txt, pinned, --no-deps, through the wheelhouse of
# scripts/_pip.sh), never in .venv. `python -m build` makes the sdist, then the wheel from that sdist (so the wheel
# holds only what the sdist ships); --no-isolation uses the pinned setuptools and wheel of that env.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
VENV=.tox/dist
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=$(cat constraints/dist.txt | sha256sum | cut -c1-16)
if ! { [ -f "$VENV/.specparity-stamp" ] && [ "$(cat "$VENV/.specparity-stamp")" = "$stamp" ]; }; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  . scripts/_pip.sh
  pinned_install "$VENV/bin/python" constraints/dist.txt
  echo "$stamp" > "$VENV/.specparity-stamp"
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# Built from a copy of the files git tracks or would track (not the ignored ones): setuptools writes its
# egg-info and build/ beside the sources, and this checkout's src/ is on .venv's path (editable install).
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -xf - -C "$src"
(cd "$src" && "$OLDPWD/$VENV/bin/python" -m build --no-isolation --outdir "$OUT" .) >&2
"$VENV/bin/python" -m twine check --strict "$OUT"/specparity-*
