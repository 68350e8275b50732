#!/bin/bash
# train_gpt --backend mpi under mpirun -np 3 prints the threads backend's param_hash for every stage
# (fp32, and bf16 in stage 3); only rank 0 prints. Under mpirun -np 4 --tp 2 (a 2 x 2 mesh) too: the
# tensor-parallel sums are added in rank order on every backend, with --sequence-parallel as without.
# With --checkpoint-activations pa-cpu and --gather-bucket-elements at 2 x 2 as well, against the plans.
# Usage: train_gpt_mpi.sh MPIRUN TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
mpirun=$1
exe=$2
np=3
small=(--embd 32 --heads 2 --layers 1 --context 16 --batch 6 --steps 6 --eval-windows 6 --sample 16 --json)

for run in "0 fp32" "1 fp32" "2 fp32" "3 fp32" "3 bf16"; do
  read -r stage precision <<<"$run"
  flags=("${small[@]}" --stage "$stage" --precision "$precision")
  e2e_run "$exe" --backend threads --ranks $np "${flags[@]}"
  e2e_json want param_hash hex
  e2e_json want_sample sample
  e2e_run "$mpirun" --oversubscribe -np $np "$exe" --backend mpi "${flags[@]}"
  e2e_json got param_hash hex
  e2e_json got_sample sample
  e2e_json backend backend
  json_lines=$(grep -c '^{' <<<"$e2e_out" || true)
  summaries=$(grep -c '^ZeRO stage' <<<"$e2e_out" || true)
  echo "stage $stage $precision: threads $want, mpi $got ($json_lines JSON line, $summaries summary)"
  e2e_same "$got" "$want" "stage $stage $precision: param_hash under MPI against threads"
  [ "$json_lines" -eq 1 ] && [ "$summaries" -eq 1 ] ||
    e2e_fail "stage $stage $precision: expected output from rank 0 only"
  e2e_same "$backend" mpi "stage $stage: the JSON line's backend"
  # The sample is computed by rank 0 from the same weights: the same text.
  e2e_same "$got_sample" "$want_sample" "stage $stage $precision: the sample under MPI against threads"
done
# --tp 2: stage 0 and stage 3, the sample included (tensor-parallel group 0 computes it).
small_tp=(--embd 32 --heads 4 --layers 1 --context 16 --batch 8 --steps 6 --eval-windows 8 --sample 16 --json --tp 2)
for stage in 0 3; do
  e2e_run "$exe" --backend threads --ranks 4 "${small_tp[@]}" --stage $stage
  e2e_json want param_hash hex
  e2e_json want_sample sample
  e2e_run "$mpirun" --oversubscribe -np 4 "$exe" --backend mpi "${small_tp[@]}" --stage $stage
  e2e_json got param_hash hex
  e2e_json got_sample sample
  echo "--tp 2 stage $stage: threads $want, mpi $got"
  e2e_same "$got" "$want" "--tp 2 stage $stage: param_hash under MPI against threads"
  e2e_same "$got_sample" "$want_sample" "--tp 2 stage $stage: the sample under MPI against threads"
  [ "$stage" = 0 ] && tp_hash=$want
done
# --sequence-parallel under MPI (the rows' all-to-alls and all-gathers over the tensor-parallel
# communicator): the hash of --tp 2 alone.
e2e_run "$mpirun" --oversubscribe -np 4 "$exe" --backend mpi "${small_tp[@]}" --stage 2 --sequence-parallel
e2e_json got param_hash hex
echo "--tp 2 --sequence-parallel stage 2 under MPI: $got (--tp 2 alone: $tp_hash)"
e2e_same "$got" "$tp_hash" "--sequence-parallel under MPI against --tp 2 alone on threads"
# ZeRO-R under MPI: Pa+cpu's all-gathers and stage 3's gather buckets in flight (MPI overlaps), the hash of
# --tp 2 alone; the store's and the engine's bytes equal their plans (tests/e2e/train_gpt_plan_check.py).
zero_r=(--embd 32 --heads 4 --layers 2 --context 16 --batch 8 --steps 4 --eval-windows 8 --sample 0 --json --tp 2)
e2e_run "$exe" --backend threads --ranks 4 "${zero_r[@]}" --stage 0
e2e_json want param_hash hex
for stage in 0 3; do
  e2e_run "$mpirun" --oversubscribe -np 4 "$exe" --backend mpi "${zero_r[@]}" --stage $stage \
    --checkpoint-activations pa-cpu --gather-bucket-elements 8192
  e2e_filter line any python3 "$(dirname "${BASH_SOURCE[0]}")/../e2e/train_gpt_plan_check.py"
  read -r got gathers buckets _ <<<"$line"
  echo "--tp 2 stage $stage, Pa+cpu and gather buckets under MPI: $got ($gathers all-gathers per step, $buckets" \
    "buckets), threads without them: $want"
  e2e_same "$got" "$want" "Pa+cpu with gather buckets under MPI at stage $stage against threads without"
done
echo "ok"
