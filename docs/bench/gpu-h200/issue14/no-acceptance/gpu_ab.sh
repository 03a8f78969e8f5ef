#!/usr/bin/env bash
# On the GPU machine (after install.sh): random 8B target and a random 1.7B-shape draft with one
# vocabulary; bench_steps' drafting A/B (no draft is ever kept) and plain 1 vs 2 ranks on one GPU.
set -uo pipefail
export PYTHONPATH=$PWD
L=$(dirname $(which python3))/mlx.launch
python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
python3 tools/random_model.py qwen3-1.7b /tmp/draft17 --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
for h in 1 2; do
  echo "== $h rank(s) on one GPU: drafting with a random 1.7B-shape model (k<=6) against plain"
  timeout 250 $L --backend ring --hostfile /tmp/h$h.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/llama8b --streams 1,4,16 --max-tokens 256 --draft-tokens 6 --draft-model /tmp/draft17 --rounds 3 \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"
done
