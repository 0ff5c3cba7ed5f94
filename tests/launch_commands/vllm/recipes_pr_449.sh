CUDA_VISIBLE_DEVICES=0 vllm serve openai/gpt-oss-120b \
  --kv-cache-dtype fp8 \
  --tool-call-parser openai \
  --enable-auto-tool-choice \
  --speculative-config '{"method": "eagle3", "model": "nvidia/gpt-oss-120b-Eagle3-v3", "num_speculative_tokens": 7}' \
  --trust-remote-code
