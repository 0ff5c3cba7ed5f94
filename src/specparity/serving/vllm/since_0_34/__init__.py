"""vLLM 0.34- (family E, serving/vllm/families.py): the V2 model runner's aux-id reader (the V1 runner is gone).
Loaded in the child only."""
