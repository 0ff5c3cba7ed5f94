"""vLLM 0.8.5-0.11.0 (family A, serving/vllm/families.py): releases with no aux-id reader. Loaded in the child only."""
