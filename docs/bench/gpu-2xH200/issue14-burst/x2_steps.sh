#!/usr/bin/env bash
# .gpuwheels/tok holds the default model's tokenizer files (and pylib/, llguidance for server.py); install.sh is the
# staged MLX CUDA build (shared/device/stage-mlx-cuda.sh). Run from the repository root on the GPU machine.
# On 2 x H200 (after install.sh, /tmp/llama8b made): bench_steps' step counts and times for bench.py's
# kind of burst (chat prompts that share the template's start), prompt cache off and on, 2 and 1 ranks.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_PER_RANK=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
for h in ${RANKSET:-2 1}; do for pc in ${PCS:-0 100000}; do
  echo "== $h rank(s), prompt cache $pc"
  timeout 120 $L --backend ring --hostfile /tmp/h$h.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/llama8b --streams ${STREAMS:-1,16,64,64} --prompt-cache $pc --prompt "Request {n}. Write a long, detailed story about the sea." \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"
done; done
if [ -n "${AB:-}" ]; then for pc in 100000; do
  echo "== 1 rank, prompt cache $pc, tree $AB"
  (cd $AB && PYTHONPATH=$PWD timeout 120 $L --backend ring --hostfile /tmp/h1.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/llama8b --streams ${STREAMS:-1,16,64,64} --prompt-cache $pc --prompt "Request {n}. Write a long, detailed story about the sea." \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO")
done; fi
