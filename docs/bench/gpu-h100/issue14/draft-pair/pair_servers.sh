#!/usr/bin/env bash
# The synthetic agreeing pair (scale 0.01) through the servers: ring plain / lookup / draft model
# against mlx_lm.server with and without --draft-model, 1 rank, one run.
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/.gpuwheels/tok/pylib  # llguidance (abi3), which the staged GPU wheels lack
S=0.01
[ -d /tmp/q$S ] || python3 tools/random_model.py llama3-8b /tmp/q$S --dtype bfloat16 --tokenizer-from .gpuwheels/tok --quiet-after 4 --quiet-scale $S >/dev/null
[ -d /tmp/q${S}d ] || python3 tools/early_exit_model.py /tmp/q$S /tmp/q${S}d --layers 4 >/dev/null
cd tools && timeout 520 python3 bench_speculative.py --gpu --ranks 1 --draft-tokens 6 --model /tmp/q$S --draft-model /tmp/q${S}d \
  --out ${OUT:-/tmp/out}/spec 2>&1 | grep -v "Socket\|WARN\|INFO" | tail -30
cat ${OUT:-/tmp/out}/spec/speculative.md
