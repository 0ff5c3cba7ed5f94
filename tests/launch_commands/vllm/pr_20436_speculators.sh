vllm serve nm-testing/eagle3-llama3.1-8b-instruct-speculators
