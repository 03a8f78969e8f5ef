#!/usr/bin/env bash
# .gpuwheels/tok holds the default model's tokenizer files (and pylib/, llguidance for server.py); install.sh is the
# staged MLX CUDA build (shared/device/stage-mlx-cuda.sh). Run from the repository root on the GPU machine.
# On 2 x H200 (after install.sh): the made agreeing pair (scale 0.01) through the servers on 2 ranks:
# ring plain / lookup / draft model beside mlx_lm.server with and without --draft-model, one run.
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/.gpuwheels/tok/pylib PYTHONUNBUFFERED=1
S=0.01
[ -d /tmp/q$S ] || python3 tools/random_model.py llama3-8b /tmp/q$S --dtype bfloat16 --tokenizer-from .gpuwheels/tok --quiet-after 4 --quiet-scale $S >/dev/null
[ -d /tmp/q${S}d ] || python3 tools/early_exit_model.py /tmp/q$S /tmp/q${S}d --layers 4 >/dev/null
cd tools && timeout ${T:-520} python3 bench_speculative.py --gpu --ranks ${RANKS:-2} --draft-tokens 6 --model /tmp/q$S --draft-model /tmp/q${S}d \
  --out $OUT/spec 2>&1 | grep -v "Socket\|WARN\|INFO" | tail -30
cat $OUT/spec/speculative.md
