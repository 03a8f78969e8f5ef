#!/usr/bin/env bash
# The drafting A/B (a never-right draft model) on 1 rank: this tree, then commit 27c51c1's speculative.py and scheduler.py
# (put in .gpuwheels/old/mlx_ring/serving/ by `git show 27c51c1:FILE`; .gpuwheels/tok holds the default model's
# tokenizer files). On the GPU machine, after staging MLX's CUDA build.
set -uo pipefail
L=$(dirname $(which python3))/mlx.launch
[ -d /tmp/llama8b ] || PYTHONPATH=$PWD python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
[ -d /tmp/draft17 ] || PYTHONPATH=$PWD python3 tools/random_model.py qwen3-1.7b /tmp/draft17 --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
rm -rf /tmp/old && mkdir /tmp/old && cp -r mlx_ring tools shard.py server.py /tmp/old/ && cp -r .gpuwheels/old/mlx_ring /tmp/old/
for tree in $PWD /tmp/old; do for h in ${RANKS:-1}; do
  echo "== $tree, $h rank(s): drafting with a random 1.7B-shape model (k<=6) against plain"
  (cd $tree && PYTHONPATH=$tree timeout 200 $L --backend ring --hostfile /tmp/h$h.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/llama8b --streams ${STREAMS:-1,4} --max-tokens 256 --draft-tokens 6 --draft-model /tmp/draft17 --rounds 8 \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO")
done; done
