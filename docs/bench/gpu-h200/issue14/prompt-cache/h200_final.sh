#!/usr/bin/env bash
# .gpuwheels/tok holds the default model's tokenizer files (and pylib/, llguidance for server.py); install.sh is the
# staged MLX CUDA build (shared/device/stage-mlx-cuda.sh). Run from the repository root on the GPU machine.
# On one H200 (after install.sh): the server path, ring on 1 rank beside mlx_lm.server, then
# bench_steps with the prompt cache on and off, 2 rounds.
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/.gpuwheels/tok/pylib PYTHONUNBUFFERED=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
timeout 300 python3 tools/bench.py --model /tmp/llama8b --gpu --ranks 1 --peers mlx_lm --concurrency 1,16,64 \
  --long-prompt 0 --out $OUT/bench 2>&1 | grep -v "Socket\|WARN\|INFO" | tail -3
cat $OUT/bench/bench.md
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
for r in 1 2; do for pc in 100000 0; do echo "== round $r, prompt cache $pc"
  timeout 100 $L --backend ring --hostfile /tmp/h1.json --starting-port 23456 -- python3 tools/bench_steps.py --model /tmp/llama8b \
    --streams 1,16,64 --prompt-cache $pc --prompt "Request {n}. Write a long, detailed story about the sea." < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"
done; done
