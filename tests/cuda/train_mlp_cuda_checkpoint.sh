#!/usr/bin/env bash
# Checkpoints between the GPU and CPU trainers: a bf16 checkpoint written by train_mlp_cuda (N=4,
# stage 3) loads in train_mlp at N=2 stage 1 with the same master weights; saved again there and
# loaded back on the GPU, its data files are byte-identical to the GPU's own (master and every
# optimizer slot survive both trips bit for bit); and a resumed GPU run equals an uninterrupted one.
# Exits 77 (skipped) where the machine has no CUDA device.
# Usage: train_mlp_cuda_checkpoint.sh DEVICE_PROBE TRAIN_MLP_CUDA TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
probe=$1
gpu=$2
cpu=$3
# The probe exits 0 with a device and 77 without one (any other CUDA error is a failure).
e2e_run_rc "$probe"
[ "$e2e_rc" -ne 77 ] || { echo "no CUDA device: skipped"; exit 77; }
[ "$e2e_rc" -eq 0 ] || e2e_fail "the device probe exited $e2e_rc: $e2e_out $e2e_err"
work=$e2e_work
common=(--json --precision bf16 --layers 3 --hidden 64)
# train VAR PROGRAM FLAGS...: VAR = the param_hash of the run.
train() {
  local var=$1
  shift
  e2e_run "$@"
  e2e_json "$var" param_hash hex
}

train g "$gpu" "${common[@]}" --ranks 4 --stage 3 --steps 20 --save "$work/gpu"
train c "$cpu" "${common[@]}" --ranks 2 --stage 1 --resume "$work/gpu" --steps 0 --save "$work/cpu"
train g2 "$gpu" "${common[@]}" --ranks 4 --stage 3 --resume "$work/cpu" --steps 0 --save "$work/back"
echo "GPU after 20 steps: $g; loaded by the CPU trainer at N=2 stage 1: $c; back on the GPU: $g2"
e2e_same "$c" "$g" "the master weights loaded by the CPU trainer against the GPU's"
e2e_same "$g2" "$g" "the master weights back on the GPU against the GPU's"
a=$(ls -d "$work"/gpu/v-* | tail -1)
b=$(ls -d "$work"/back/v-* | tail -1)
for f in "$a"/rank-*.bin; do
  cmp "$f" "$b/$(basename "$f")" || e2e_fail "$(basename "$f") differs after GPU -> CPU -> GPU"
done
echo "data files (master and optimizer slots) identical after GPU -> CPU -> GPU"

train straight "$gpu" "${common[@]}" --ranks 4 --stage 3 --steps 40
train resumed "$gpu" "${common[@]}" --ranks 2 --stage 2 --resume "$work/gpu" --steps 20
train resumed4 "$gpu" "${common[@]}" --ranks 4 --stage 3 --resume "$work/gpu" --steps 20
echo "40 steps straight: $straight; 20 + 20 resumed at N=4 stage 3: $resumed4 (at N=2 stage 2: $resumed)"
e2e_same "$resumed4" "$straight" "a resumed GPU run against an uninterrupted one"
echo "1 passed, 0 failed"
