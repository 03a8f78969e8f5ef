#!/usr/bin/env bash
# On one H200 (after install.sh): bench_steps on 1 rank, then on 2 ranks sharing the GPU with --trace
# (the decode timeline of the last stream count), cache off. x2_trace.sh runs it with a GPU per rank.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null 2>&1
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
p=24500
run() { p=$((p+20)); timeout 150 $L --backend ring --hostfile /tmp/h$1.json --starting-port $p -- python3 tools/bench_steps.py \
  --model /tmp/llama8b "${@:2}" < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"; }
echo "== 1 rank"; run 1 --streams 1,16,64
where=${CUDA_PER_RANK:+a GPU each}
for s in 64,1 1,16 1,16,64; do echo "== 2 ranks, ${where:-one GPU}, trace of the last of $s"; run 2 --streams $s --trace $OUT/trace-2ranks-${s##*,}.json; done
