#!/usr/bin/env bash
# Every vLLM release with EAGLE-3, one env at a time (issue 37): scripts/vllm-releases.sh [MINOR ...]   (make test-vllm-releases)
#
# For each minor of idrules/vllm_releases.py (0.8 ... 0.34) that has a pinned list, constraints/vllm-<minor>.txt:
# build .tox/vllm-<minor> (scripts/venv-engine.sh vllm; each env is ~4-8 GB and releases pin different torch),
# run its matrix tests (scripts/matrix.sh vllm-<minor>: the whole vLLM suite on a CPU build, the static tier on a
# CUDA-only one), then remove the env unless CI keeps it (KEEP below: the family representatives .ci/run runs), so
# that only one extra env is on disk at a time. A minor with no list is reported as not built, with why
# (serving/vllm/families.py untested_why). The summary gives each minor's seconds and result; exit 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
KEEP=" 0.19 0.32 0.34 "
PY=${PYTHON:-.venv/bin/python}
minors=("$@")
if [ ${#minors[@]} -eq 0 ]; then
  mapfile -t minors < <("$PY" -c 'from specparity.idrules.vllm_releases import KNOWN_MINORS; print("\n".join(KNOWN_MINORS))')
fi
summary=(); failed=0
for m in "${minors[@]}"; do
  if [ ! -f "constraints/vllm-$m.txt" ]; then
    why=$("$PY" -c "from specparity.serving.vllm.families import family_for; f = family_for('$m.0').family; print(f.letter + ': ' + (f.untested_why or 'no pinned list'))")
    summary+=("vllm-$m  not built (family $why)"); continue
  fi
  t0=$(date +%s)
  if scripts/matrix.sh "vllm-$m"; then result=passed; else result=FAILED; failed=1; fi
  [[ "$KEEP" == *" $m "* ]] || rm -rf ".tox/vllm-$m"
  summary+=("vllm-$m  $result in $(( $(date +%s) - t0 )) s")
done
printf '%s\n' "=== vLLM releases" "${summary[@]}" >&2
exit $failed
