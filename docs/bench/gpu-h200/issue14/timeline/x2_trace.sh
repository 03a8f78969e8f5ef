#!/usr/bin/env bash
# On 2 x H200 (after install.sh): the same as trace_h200.sh with one GPU per rank (CUDA_PER_RANK=1):
# bench_steps on 1 rank, then 2 ranks with --trace, where a decode step's time goes on each GPU.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_PER_RANK=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null 2>&1
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
p=24500
run() { p=$((p+20)); timeout 150 $L --backend ring --hostfile /tmp/h$1.json --starting-port $p -- python3 tools/bench_steps.py \
  --model /tmp/llama8b "${@:2}" < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"; }
echo "== 1 rank"; run 1 --streams 1,16,64
for s in 64,1 1,16 1,16,64; do echo "== 2 ranks, one GPU each, trace of the last of $s"; run 2 --streams $s --trace $OUT/trace-x2-${s##*,}.json; done
