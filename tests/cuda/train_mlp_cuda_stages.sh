#!/usr/bin/env bash
# train_mlp_cuda end to end on a GPU: the same checks as train_mlp's, through the CPU trainer's script
# (default tests/train_mlp_stages.sh: stages 0-3 print the same param_hash, measured bytes equal the
# formulas, the default run halves the loss; or train_mlp_precision.sh: bf16, fp16, clipping and
# accumulation). Exits 77 (skipped) without a usable CUDA device.
# Usage: train_mlp_cuda_stages.sh DEVICE_PROBE TRAIN_MLP_CUDA [SCRIPT]
set -eu
probe=$1
train=$2
if ! "$probe"; then
  echo "no usable CUDA device: skipped"
  exit 77
fi
exec bash "$(dirname "$0")/../${3:-train_mlp_stages.sh}" "$train"
