#!/usr/bin/env bash
# .gpuwheels/tok holds the default model's tokenizer files (and pylib/, llguidance for server.py); install.sh is the
# staged MLX CUDA build (shared/device/stage-mlx-cuda.sh). Run from the repository root on the GPU machine.
# On one GPU (after install.sh): a burst of chat prompts sharing the template's start through
# bench_steps, 1 rank, in turn: 362ef31 (ab0), batched LOAD/SAVE (ab1), this tree (cur), this tree
# without the prompt cache (nocache); ROUNDS rounds; then cur's rank-0 profile at 64 streams.
set -uo pipefail
export PYTHONUNBUFFERED=1 CUDA_PER_RANK=1
[ -d /tmp/llama8b ] || PYTHONPATH=$PWD python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
steps() { (cd $1 && PYTHONPATH=$1 timeout 100 $L --backend ring --hostfile /tmp/h1.json --starting-port 23456 -- python3 tools/bench_steps.py \
  --model /tmp/llama8b --streams 1,16,64 --prompt-cache $2 ${3:-} --prompt "Request {n}. Write a long, detailed story about the sea." \
  < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"); }
for r in $(seq ${ROUNDS:-3}); do
  for t in ab0 ab1 cur nocache; do
    echo "== round $r $t"
    case $t in ab0|ab1) steps $PWD/.gpuwheels/$t 100000;; cur) steps $PWD 100000;; nocache) steps $PWD 0;; esac
  done
done
echo "== cur, profile"; steps $PWD 100000 --profile | head -30
