#!/usr/bin/env bash
# A synthetic agreeing pair on the GPU: a random 8B whose layers from 4 on barely change the residual
# (output projections scaled by S), and its first 4 layers as the draft; bench_steps' A/B on 1 rank.
set -uo pipefail
export PYTHONPATH=$PWD
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
for S in ${SCALES:-0.01 0.05}; do
  [ -d /tmp/q$S ] || python3 tools/random_model.py llama3-8b /tmp/q$S --dtype bfloat16 --tokenizer-from .gpuwheels/tok --quiet-after 4 --quiet-scale $S >/dev/null
  [ -d /tmp/q${S}d ] || python3 tools/early_exit_model.py /tmp/q$S /tmp/q${S}d --layers 4 >/dev/null
  echo "== quiet scale $S: the 8B drafted for by its first 4 layers (k<=6) against plain, 1 rank"
  timeout 200 $L --backend ring --hostfile /tmp/h1.json --starting-port 23456 -- python3 tools/bench_steps.py \
    --model /tmp/q$S --streams ${STREAMS:-1,4} --max-tokens 256 --draft-tokens 6 --draft-model /tmp/q${S}d --rounds 3 \
    < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO" | sed 's/, steps {[^}]*}//'
done
