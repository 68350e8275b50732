#!/usr/bin/env bash
# train_gpt with ZeRO-R inside the 2 x 2 (dp x tp) mesh: --checkpoint-activations whole, pa (Pa) and pa-cpu
# (Pa+cpu) with --gather-bucket-elements (CB) at every stage give the bits of the run without them; the
# activation store's bytes and traffic equal plan_activations', the engine's transient peak, bytes and
# all-gathers per step equal zero::plan's, model states and traffic equal the formulas; stage 3's buckets
# fuse all-gathers; the usage errors.
# (tests/mpi/train_gpt_mpi.sh runs the same under mpirun -np 4.)
# Usage: train_gpt_checkpointing.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
mesh=(--embd 32 --heads 4 --layers 2 --context 16 --eval-windows 8 --sample 0 --json --ranks 4 --tp 2 --batch 8
      --steps 4)
# The units at tp 2: wte about 3,000 elements, wpe 512, each block 6,336, ln_f 64. A budget of 8,192
# fuses wte with wpe and the last block with ln_f.
buckets=(--gather-bucket-elements 8192)

check() {  # reads the JSON line: formulas and plans; prints "hash gathers buckets saved host"
  python3 "$(dirname "${BASH_SOURCE[0]}")/train_gpt_plan_check.py"
}

e2e_run "$train_gpt" "${mesh[@]}" --stage 0
e2e_filter ref_line any check
read -r ref _ <<<"$ref_line"
echo "2 x 2 without checkpointing: param_hash $ref"

runs=0
declare -A saved host
for mode in whole pa pa-cpu; do
  for stage in 0 1 2 3; do
    e2e_run "$train_gpt" "${mesh[@]}" --stage $stage --checkpoint-activations $mode "${buckets[@]}"
    e2e_filter line any check
    read -r h gathers nbuckets s_bytes h_bytes <<<"$line"
    echo "$mode stage $stage: param_hash $h, $gathers all-gathers per step ($nbuckets buckets in the run)," \
      "checkpoints $s_bytes bytes in the system's memory, $h_bytes in host memory"
    e2e_same "$h" "$ref" "--checkpoint-activations $mode at stage $stage against no checkpointing"
    saved[$mode]=$s_bytes
    host[$mode]=$h_bytes
    runs=$((runs + 1))
  done
done
# 2 blocks x 4 rows x 16 positions x 32 channels of fp32 per micro-batch: whole keeps 16 KiB per rank,
# Pa half of it (the group's 2 ranks), Pa+cpu that half in host memory.
e2e_same "${saved[whole]} ${host[whole]}" "16384 0" "whole: the checkpoints' bytes"
e2e_same "${saved[pa]} ${host[pa]}" "8192 0" "Pa: the checkpoints' bytes"
e2e_same "${saved[pa-cpu]} ${host[pa-cpu]}" "0 8192" "Pa+cpu: the checkpoints' bytes"
echo "$runs runs: the bits of no checkpointing at every stage and mode"

# Stage 3's buckets: fewer all-gathers per step than unit by unit, the same bits.
e2e_run "$train_gpt" "${mesh[@]}" --stage 3
e2e_filter line any check
read -r h unit_gathers nbuckets _ <<<"$line"
e2e_run "$train_gpt" "${mesh[@]}" --stage 3 "${buckets[@]}"
e2e_filter line any check
read -r hb bucket_gathers nbuckets _ <<<"$line"
echo "stage 3: $unit_gathers all-gathers per step unit by unit, $bucket_gathers with buckets ($nbuckets buckets)"
e2e_same "$hb" "$h" "stage 3 with gather buckets against without"
e2e_same "$h" "$ref" "stage 3 against stage 0"
[ "$bucket_gathers" -lt "$unit_gathers" ] && [ "$nbuckets" -gt 0 ] ||
  e2e_fail "--gather-bucket-elements fused no all-gathers ($bucket_gathers against $unit_gathers)"

# bf16 with accumulation and clipping, and sequence parallelism (its rows checkpointed whole).
e2e_run "$train_gpt" "${mesh[@]}" --stage 3 --precision bf16 --accum 2 --clip 0.5
e2e_filter line any check
read -r a _ <<<"$line"
e2e_run "$train_gpt" "${mesh[@]}" --stage 3 --precision bf16 --accum 2 --clip 0.5 --checkpoint-activations pa-cpu \
  "${buckets[@]}"
e2e_filter line any check
read -r b _ <<<"$line"
e2e_same "$b" "$a" "Pa+cpu with buckets, bf16, accum 2, clip, stage 3"
e2e_run "$train_gpt" "${mesh[@]}" --stage 2 --sequence-parallel --checkpoint-activations whole
e2e_filter line any check
read -r b _ _ s_bytes _ <<<"$line"
e2e_same "$b" "$ref" "--sequence-parallel with checkpoints against no checkpointing"
e2e_same "$s_bytes" "8192" "--sequence-parallel: each rank checkpoints its half of the rows"
echo "bf16 accum 2 with Pa+cpu, and --sequence-parallel with whole checkpoints: the same bits"

# Usage errors, exit 2.
e2e_expect 2 "--checkpoint-activations pa partitions each checkpoint over a tensor-parallel group: give --tp > 1" \
  "$train_gpt" --ranks 2 --batch 8 --checkpoint-activations pa
e2e_expect 2 "--checkpoint-activations pa-cpu with --sequence-parallel" \
  "$train_gpt" "${mesh[@]}" --sequence-parallel --checkpoint-activations pa-cpu
e2e_expect 2 "--gather-bucket-elements with --qwz" "$train_gpt" "${mesh[@]}" --stage 3 --qwz "${buckets[@]}"
e2e_expect 2 "--checkpoint-activations" "$train_gpt" "${mesh[@]}" --checkpoint-activations all
echo "1 passed, 0 failed"
