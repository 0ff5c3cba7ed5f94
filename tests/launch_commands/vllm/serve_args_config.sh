vllm serve --config config.yaml
