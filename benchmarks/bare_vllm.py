"""The bare vLLM run the vLLM benchmarks (bench_vllm_gate.py, bench_real_model.py) hold the gate to.

``BARE_GENERATE`` is a ``python -c`` script for the vLLM env: ``BARE_GENERATE TP TARGET DRAFT PROBES_JSON`` builds
``vllm.LLM`` with the settings the gate uses (EAGLE-3, 3 speculative tokens, float32, eager) and generates each
probe of the JSON file (a list of token-id lists) greedily, one request each, 16 tokens, nothing else. The model
length fits the longest probe (at least 256).
"""

BARE_GENERATE = r"""
import json, os, sys
tp = int(sys.argv[1])
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
if tp == 1:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
else:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % (os.cpu_count() or 1)) for r in range(tp)))
def main():
    from vllm import LLM, SamplingParams
    with open(sys.argv[4]) as f:
        probes = json.load(f)
    longest = max(len(p) for p in probes)
    llm = LLM(model=sys.argv[2], seed=0, enforce_eager=True, disable_log_stats=False, enable_prefix_caching=False,
              max_num_seqs=1, max_model_len=max(256, longest + 16 + 3 + 8),
              max_num_batched_tokens=max(256, longest + 27), dtype="float32", gpu_memory_utilization=0.3,
              tensor_parallel_size=tp,
              speculative_config={"method": "eagle3", "model": sys.argv[3], "num_speculative_tokens": 3})
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for p in probes:
        llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)
    sys.stdout.flush()
    os._exit(0)
if __name__ == "__main__":
    main()
"""
