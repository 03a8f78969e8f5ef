#!/usr/bin/env bash
# .gpuwheels/tok holds the default model's tokenizer files (and pylib/, llguidance for server.py); install.sh is the
# staged MLX CUDA build (shared/device/stage-mlx-cuda.sh). Run from the repository root on the GPU machine.
# On 2 x H200 (after install.sh): the ring on 2 ranks and 1 rank beside mlx_lm.server, one run.
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/.gpuwheels/tok/pylib PYTHONUNBUFFERED=1
nvidia-smi -L
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null
git log --oneline -1 2>/dev/null
timeout ${T:-500} python3 tools/bench.py --model /tmp/llama8b --gpu --ranks 2,1 --peers mlx_lm --concurrency 1,16,64 \
  --long-prompt 4096 --out $OUT/bench 2>&1 | grep -v "Socket\|WARN\|INFO" | tail -30
cat $OUT/bench/bench.md
