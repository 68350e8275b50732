#!/bin/bash
# examples/train_loop --backend mpi under mpirun -np 2 prints the threads backend's param_hash for
# every stage, only rank 0 prints, and a threads checkpoint (N=4 stage 3) resumes under MPI (N=2).
# Usage: train_loop_mpi.sh MPIRUN TRAIN_LOOP
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
mpirun=$1
exe=$2
work=$e2e_work
final_hash='s/^final step [0-9]* param_hash \([0-9a-f]\{16\}\)$/\1/p'
steps=(--steps 30 --eval-every 10)

for stage in 0 1 2 3; do
  e2e_run "$exe" --backend threads --ranks 2 --stage $stage "${steps[@]}"
  e2e_sed want "$final_hash" hex
  e2e_run "$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --stage $stage "${steps[@]}"
  e2e_sed got "$final_hash" hex  # exactly one final line: rank 0 only
  echo "stage $stage: threads $want, mpi $got"
  e2e_same "$got" "$want" "stage $stage: param_hash under MPI against threads"
done

e2e_run "$exe" --backend threads --ranks 4 --stage 3 --steps 15 --schedule-steps 30 --eval-every 0 --save "$work/ck"
e2e_run "$exe" --backend threads --ranks 4 --stage 3 "${steps[@]}"
e2e_sed want "$final_hash" hex
e2e_run "$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --stage 1 "${steps[@]}" --resume "$work/ck"
e2e_sed got "$final_hash" hex
echo "threads N=4 stage 3 saved at 15, resumed under mpirun -np 2 stage 1: $got (uninterrupted $want)"
e2e_same "$got" "$want" "the MPI resume against the uninterrupted run"

# A --ranks that contradicts the communicator is a usage error.
e2e_run_rc "$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --ranks 4
[ "$e2e_rc" -ne 0 ] || e2e_fail "--ranks 4 under -np 2 was accepted"
echo "ok"
