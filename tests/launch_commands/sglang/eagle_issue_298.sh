python3 -m sglang.launch_server \
    --model /models/Qwen3-8B \
    --speculative-algorithm EAGLE3 \
    --speculative-draft-model-path engyunw/qwen3_8b_eagle3 \
    --speculative-num-steps 6 \
    --speculative-eagle-topk 10 \
    --speculative-num-draft-tokens 32 \
    --mem-fraction 0.9 --cuda-graph-max-bs 2 \
    --port 30000 
