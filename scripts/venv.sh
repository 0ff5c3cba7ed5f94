#!/usr/bin/env bash
# Create or reuse .venv/ at the repo root with the default SGLang (0.5.23) and the dev tools.
# Idempotent: a stamp records the hash of every input list; a matching stamp means nothing to do.
# sglang's own dependency set pulls CUDA-only packages, so it goes in with --no-deps plus the pinned
# list in constraints/ (see docs/sglang-versions.md). torch 2.14.1 is the CUDA build; it runs on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
inputs="constraints/sglang-0.5.23.txt constraints/sglang-server-0.5.23.txt constraints/torch-0.5.23.txt constraints/dev.txt constraints/fast.txt constraints/real-model.txt pyproject.toml scripts/venv.sh"
stamp=$(cat $inputs | sha256sum | cut -c1-16)
if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$stamp" ]; then
  exit 0
fi
echo "specparity: preparing $VENV (first time: a few minutes; pip's cache makes later runs fast)" >&2
pip() { "$VENV/bin/python" -m pip "$@"; }
. scripts/_pip.sh  # torch_layer: torch shared by hard links; pinned_install: the lists through a wheelhouse; env layers
lists=(constraints/sglang-0.5.23.txt constraints/sglang-server-0.5.23.txt constraints/dev.txt constraints/fast.txt constraints/real-model.txt)
# the pinned packages of an earlier build from the same lists, hard-linked (scripts/_pip.sh: env layers)
key=$(env_layer_key "$PY" constraints/torch-0.5.23.txt "${lists[@]}")
if ! env_layer_restore "$PY" "$VENV" "$key"; then
  fresh=0
  [ -x "$VENV/bin/python" ] || { "$PY" -m venv "$VENV"; fresh=1; }
  torch_layer "$VENV/bin/python" constraints/torch-0.5.23.txt
  for list in "${lists[@]}"; do pinned_install "$VENV/bin/python" "$list"; done
  # kept only from a fresh venv: one built over an earlier env may hold that env's leftovers
  if [ "$fresh" = 1 ]; then env_layer_save "$VENV" "$key"; fi
fi
pip install -q --disable-pip-version-check --no-deps -e .
echo "$stamp" > "$VENV/.stamp"
