#!/bin/bash
# train_gpt --backend mpi under mpirun -np 3 prints the threads backend's param_hash for every stage
# (fp32, and bf16 in stage 3); only rank 0 prints.
# Usage: train_gpt_mpi.sh MPIRUN TRAIN_GPT
set -u
mpirun=$1
exe=$2
np=3
small=(--embd 32 --heads 2 --layers 1 --context 16 --batch 6 --steps 6 --eval-windows 6 --sample 16 --json)
status=0
hash_of() { grep -o '"param_hash":"[0-9a-f]*"' | cut -d'"' -f4; }
fail() { echo "FAIL: $*"; status=1; }

for run in "0 fp32" "1 fp32" "2 fp32" "3 fp32" "3 bf16"; do
  read -r stage precision <<<"$run"
  flags=("${small[@]}" --stage "$stage" --precision "$precision")
  threads_out=$("$exe" --backend threads --ranks $np "${flags[@]}" 2>/dev/null) || fail "threads run $run exited with $?"
  mpi_out=$("$mpirun" --oversubscribe -np $np "$exe" --backend mpi "${flags[@]}" 2>/dev/null) ||
    fail "mpi run $run exited with $?"
  want=$(tail -n1 <<<"$threads_out" | hash_of)
  got=$(tail -n1 <<<"$mpi_out" | hash_of)
  json_lines=$(grep -c '^{' <<<"$mpi_out")
  summaries=$(grep -c '^ZeRO stage' <<<"$mpi_out")
  echo "stage $stage $precision: threads $want, mpi $got ($json_lines JSON line, $summaries summary)"
  [ -n "$want" ] && [ "$want" = "$got" ] || fail "stage $stage $precision: param_hash differs"
  [ "$json_lines" -eq 1 ] && [ "$summaries" -eq 1 ] || fail "stage $stage $precision: expected output from rank 0 only"
  grep -q '"backend":"mpi"' <<<"$mpi_out" || fail "stage $stage: the JSON line does not say backend mpi"
  # The sample is computed by rank 0 from the same weights: the same text.
  sample() { tail -n1 | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["sample"])'; }
  [ "$(sample <<<"$threads_out")" = "$(sample <<<"$mpi_out")" ] || fail "stage $stage $precision: the sample differs"
done
[ $status -eq 0 ] && echo "ok"
exit $status
