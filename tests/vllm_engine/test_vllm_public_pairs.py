"""Real public drafter/target pairs under ``explain --engine vllm`` (the pairs and their provenance:
public_pairs.py and tests/serving/configs/public/README.md): no pair exits 1 for a reason that is not the deployment's
own, every answer equals vLLM's own reader in this env, the silent default fallback is a warning naming its shape, and
SpecForge-style ids get the cross-engine shift hint. A pair the release itself refuses (vLLM's own EngineArgs raises:
0.17.1's SpeculativeConfig takes eagle3 only for the model types it lists, kimi_k2 from 0.18; 0.11.0 has no
KimiK25ForConditionalGeneration) exits 1 quoting vLLM's own refusal, the deployment's reason on that release; one it
cannot resolve on a CPU only (0.11.0's CPU backend sends a sliding-window target to V0, which has no EAGLE: gpt-oss)
exits 3 naming the machine's limit.

CI runs one pair of each kind (the fallback shapes, a quantized target, a multimodal one, the shift); the whole sweep
(35 pairs, one vLLM start each) runs with ``SPECPARITY_VLLM_SWEEP=1`` (``make test-vllm-sweep``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from public_pairs import Pair, deployment, explain_in_process, pairs, vllm_reading

from specparity.cli_command import explain_exit
from specparity.idrules.vllm import READ_PATHS, read_ids
from specparity.idrules.vllm_shapes import fallback_shape

pytestmark = pytest.mark.vllm
CI_PAIRS = {"llama3-70B-ealge3", "llama3-70B+eagle_config-without-key", "llama3-70B+ids-null", "llama3-70B+ids-empty",
            "llama3-70B+ids-at-wrong-level", "llama3-70B+speculators-top-level", "gpt-oss-20B-eagle3",
            "moonshotai--Kimi-K2.5+specforge-style"}
PAIRS = [p for p in pairs() if os.environ.get("SPECPARITY_VLLM_SWEEP") or p.name in CI_PAIRS]
SHAPES = {"llama3-70B-ealge3": "no_eagle_config", "llama3-70B+eagle_config-without-key": "eagle_config_without_key",
          "llama3-70B+ids-null": "ids_null", "llama3-70B+ids-empty": "ids_empty",
          "llama3-70B+ids-at-wrong-level": "key_at_wrong_level"}


def cpu_backend_only(target: Path) -> bool:
    """vLLM's own V1 oracle sends this target to V0 on a CPU only (0.11.0 engine/arg_utils.py: "sliding window (CPU
    backend)"; releases without the oracle have no V0)."""
    import inspect

    from vllm.engine.arg_utils import EngineArgs

    oracle = getattr(EngineArgs, "_is_v1_supported_oracle", None)
    if oracle is None or "sliding window (CPU backend)" not in inspect.getsource(oracle):
        return False
    try:
        return EngineArgs(model=str(target), max_model_len=256).create_model_config().get_sliding_window() is not None
    except Exception:  # the release refuses the target's own config (an architecture it does not know)
        return False


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_public_pair_is_explained_as_vllm_reads_it(pair: Pair, tmp_path: Path) -> None:
    import vllm

    target, draft = deployment(tmp_path, pair)
    e = explain_in_process(target, draft)
    try:
        expected = vllm_reading(target, draft)  # vLLM's own config resolution and reader, this env
    except AssertionError:
        raise
    except Exception as exc:  # vLLM cannot resolve the pair here
        if cpu_backend_only(target):  # 0.11.0 on a CPU: a sliding-window target leaves V1, V0 has no EAGLE (exit 3)
            assert e.exit_code == 3 and e.data["error"]["kind"] == "needs_hardware", (e.summary, str(exc)[:300])
            assert "sliding window (CPU backend)" in e.summary and "needs the deployment's GPU" in e.summary
            return
        # the release refuses the pair itself, on any machine: explain says so, quoting vLLM (exit 1)
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if ln.startswith("Value error,")), lines[0]).split(" [type=")[0]
        assert e.exit_code == 1 and e.data["error"]["kind"] == "vllm_exception", (e.summary, why)
        assert why[:200] in e.data["error"]["message"], (why, e.summary)  # its head: a long line is shortened
        return
    # never a false alarm of ours: a resolved deployment (exit 0), or the machine's limit named (exit 3)
    assert e.exit_code == 0, (e.summary, e.lines)
    served = tuple(e.data["layers_to_capture"])
    assert served == expected, (served, e.summary)  # vLLM's own reader, this env
    notes = {n["kind"]: n for n in e.data["adapter_notes"]}
    read = read_ids(pair.draft, num_layers=int(e.data["num_layers"]), version=str(vllm.__version__))
    if read.ids is None:  # vLLM serves its default: a warning naming the exact shape, --strict exits 1
        assert notes["default_ids_fallback"]["severity"] == "warning"
        shape = fallback_shape(pair.draft, reads=READ_PATHS[read.reader])
        assert shape is not None and notes["default_ids_fallback"]["shape"] == shape.shape
        if pair.name in SHAPES and read.reader == "nested":  # 0.22-0.33 read eagle_config's key
            assert shape.shape == SHAPES[pair.name]
        assert explain_exit(0, e.summary, [], e.data, strict=True)[0] == 1
    else:
        assert "default_ids_fallback" not in notes
    if pair.draft.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids") and read.key and \
            read.key.startswith("eagle_config"):  # SpecForge's nested ids, read by vLLM without SGLang's +1
        assert "read with SGLang's/SpecForge's +1" in notes["engine_convention_mismatch"]["message"]
