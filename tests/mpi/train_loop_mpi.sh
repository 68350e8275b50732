#!/bin/bash
# examples/train_loop --backend mpi under mpirun -np 2 prints the threads backend's param_hash for
# every stage, only rank 0 prints, and a threads checkpoint (N=4 stage 3) resumes under MPI (N=2).
# Usage: train_loop_mpi.sh MPIRUN TRAIN_LOOP
set -u
mpirun=$1
exe=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
hash_of() { sed -n 's/^final step [0-9]* param_hash \([0-9a-f]\{16\}\)$/\1/p'; }
fail() { echo "FAIL: $*"; status=1; }
steps=(--steps 30 --eval-every 10)

for stage in 0 1 2 3; do
  want=$("$exe" --backend threads --ranks 2 --stage $stage "${steps[@]}" | hash_of)
  out=$("$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --stage $stage "${steps[@]}" 2>&1) ||
    fail "mpi run of stage $stage exited with $?: $out"
  got=$(hash_of <<<"$out")
  echo "stage $stage: threads $want, mpi $got"
  [ -n "$want" ] && [ "$want" = "$got" ] || fail "stage $stage: param_hash differs (threads '$want', mpi '$got')"
  finals=$(grep -c '^final step' <<<"$out")
  [ "$finals" -eq 1 ] || fail "stage $stage: $finals final lines, expected one (rank 0 only)"
done

"$exe" --backend threads --ranks 4 --stage 3 --steps 15 --schedule-steps 30 --eval-every 0 --save "$work/ck" >/dev/null ||
  fail "threads save exited with $?"
want=$("$exe" --backend threads --ranks 4 --stage 3 "${steps[@]}" | hash_of)
got=$("$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --stage 1 "${steps[@]}" --resume "$work/ck" 2>&1 | hash_of)
echo "threads N=4 stage 3 saved at 15, resumed under mpirun -np 2 stage 1: $got (uninterrupted $want)"
[ -n "$want" ] && [ "$want" = "$got" ] || fail "the MPI resume ends with '$got', the uninterrupted run with '$want'"

# A --ranks that contradicts the communicator is a usage error.
"$mpirun" --oversubscribe -np 2 "$exe" --backend mpi --ranks 4 >/dev/null 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "--ranks 4 under -np 2 was accepted"

[ $status -eq 0 ] && echo "ok"
exit $status
