#!/usr/bin/env bash
# train_mlp_cuda end to end on a GPU: the same checks as train_mlp's, through the CPU trainer's script
# (default tests/e2e/train_mlp_stages.sh: stages 0-3 print the same param_hash, measured bytes equal the
# formulas, the default run halves the loss; or train_mlp_precision.sh: bf16, fp16, clipping and
# accumulation). Exits 77 (skipped) where the machine has no CUDA device.
# Usage: train_mlp_cuda_stages.sh DEVICE_PROBE TRAIN_MLP_CUDA [SCRIPT]
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
probe=$1
train=$2
# The probe exits 0 with a device and 77 without one (any other CUDA error is a failure).
e2e_run_rc "$probe"
[ "$e2e_rc" -ne 77 ] || { echo "no CUDA device: skipped"; exit 77; }
[ "$e2e_rc" -eq 0 ] || e2e_fail "the device probe exited $e2e_rc: $e2e_out $e2e_err"
bash "$(dirname "${BASH_SOURCE[0]}")/../e2e/${3:-train_mlp_stages.sh}" "$train"
