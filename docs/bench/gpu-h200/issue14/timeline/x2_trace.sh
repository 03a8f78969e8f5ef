#!/usr/bin/env bash
# On 2 x H200 (after install.sh): trace_h200.sh with one GPU per rank, where a decode step's time goes on each GPU.
export CUDA_PER_RANK=1
exec bash "$(dirname "$0")/trace_h200.sh"
