"""vLLM 0.11.1-0.33 (families B, C, D, serving/vllm/families.py): the V1 model runner's aux-id reader. Loaded in the
child only."""
