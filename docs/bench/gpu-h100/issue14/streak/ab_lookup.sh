#!/usr/bin/env bash
# Prompt lookup on the random 8B (1 rank; its answers never repeat, so lookup finds nothing to guess
# from): plain and drafting in turn, 6 rounds; this tree, then commit 27c51c1's speculative.py and scheduler.py
# (put in .gpuwheels/old/mlx_ring/serving/ by `git show 27c51c1:FILE`; .gpuwheels/tok holds the default model's
# tokenizer files). On the GPU machine, after staging MLX's CUDA build.
set -uo pipefail
L=$(dirname $(which python3))/mlx.launch
[ -d /tmp/llama8b ] || PYTHONPATH=$PWD python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
rm -rf /tmp/old && mkdir /tmp/old && cp -r mlx_ring tools shard.py server.py /tmp/old/ && cp -r .gpuwheels/old/mlx_ring /tmp/old/
for tree in $PWD /tmp/old; do
  echo "== $tree: prompt lookup (k<=6) against plain"
  (cd $tree && PYTHONPATH=$tree timeout 250 $L --backend ring --hostfile /tmp/h1.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/llama8b --streams 1,4 --max-tokens 256 --draft-tokens 6 --rounds 6 \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO" | sed 's/, steps {[^}]*}//')
done
