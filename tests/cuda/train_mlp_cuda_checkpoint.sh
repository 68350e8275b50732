#!/usr/bin/env bash
# Checkpoints between the GPU and CPU trainers: a bf16 checkpoint written by train_mlp_cuda (N=4,
# stage 3) loads in train_mlp at N=2 stage 1 with the same master weights; saved again there and
# loaded back on the GPU, its data files are byte-identical to the GPU's own (master and every
# optimizer slot survive both trips bit for bit); and a resumed GPU run equals an uninterrupted one.
# Exits 77 (skipped) without a usable CUDA device.
# Usage: train_mlp_cuda_checkpoint.sh DEVICE_PROBE TRAIN_MLP_CUDA TRAIN_MLP
set -eu
probe=$1
gpu=$2
cpu=$3
if ! "$probe"; then
  echo "no usable CUDA device: skipped"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hash_of() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['param_hash'])"; }
common=(--json --precision bf16 --layers 3 --hidden 64)

g=$("$gpu" "${common[@]}" --ranks 4 --stage 3 --steps 20 --save "$work/gpu" 2>/dev/null | hash_of)
c=$("$cpu" "${common[@]}" --ranks 2 --stage 1 --resume "$work/gpu" --steps 0 --save "$work/cpu" 2>/dev/null | hash_of)
g2=$("$gpu" "${common[@]}" --ranks 4 --stage 3 --resume "$work/cpu" --steps 0 --save "$work/back" 2>/dev/null | hash_of)
echo "GPU after 20 steps: $g; loaded by the CPU trainer at N=2 stage 1: $c; back on the GPU: $g2"
[ "$g" = "$c" ] && [ "$g" = "$g2" ] || { echo "FAIL: the master weights changed between the trainers"; exit 1; }
a=$(ls -d "$work"/gpu/v-* | tail -1)
b=$(ls -d "$work"/back/v-* | tail -1)
for f in "$a"/rank-*.bin; do
  cmp "$f" "$b/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs after GPU -> CPU -> GPU"; exit 1; }
done
echo "data files (master and optimizer slots) identical after GPU -> CPU -> GPU"

straight=$("$gpu" "${common[@]}" --ranks 4 --stage 3 --steps 40 2>/dev/null | hash_of)
resumed=$("$gpu" "${common[@]}" --ranks 2 --stage 2 --resume "$work/gpu" --steps 20 2>/dev/null | hash_of)
resumed4=$("$gpu" "${common[@]}" --ranks 4 --stage 3 --resume "$work/gpu" --steps 20 2>/dev/null | hash_of)
echo "40 steps straight: $straight; 20 + 20 resumed at N=4 stage 3: $resumed4 (at N=2 stage 2: $resumed)"
[ "$straight" = "$resumed4" ] || { echo "FAIL: a resumed GPU run differs from an uninterrupted one"; exit 1; }
echo "1 passed, 0 failed"
