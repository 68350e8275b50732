#!/bin/bash
# train_mlp --backend mpi under mpirun -np 4 prints the threads backend's param_hash for every stage;
# only rank 0 prints; a --ranks that contradicts the communicator is a usage error (exit 2).
set -u
mpirun=$1
exe=$2
np=4
steps=(--steps 25)
status=0

hash_of() { grep -o '"param_hash":"[0-9a-f]*"' | cut -d'"' -f4; }
fail() { echo "FAIL: $*"; status=1; }

for stage in 0 1 2 3; do
  threads_out=$("$exe" --backend threads --ranks $np --stage $stage "${steps[@]}" --json 2>/dev/null) ||
    fail "threads run of stage $stage exited with $?"
  mpi_out=$("$mpirun" --oversubscribe -np $np "$exe" --backend mpi --stage $stage "${steps[@]}" --json 2>/dev/null) ||
    fail "mpi run of stage $stage exited with $?"
  want=$(tail -n1 <<<"$threads_out" | hash_of)
  got=$(tail -n1 <<<"$mpi_out" | hash_of)
  json_lines=$(grep -c '^{' <<<"$mpi_out")
  summaries=$(grep -c '^ZeRO stage' <<<"$mpi_out")
  echo "stage $stage: threads $want, mpi $got ($json_lines JSON line, $summaries summary)"
  [ -n "$want" ] && [ "$want" = "$got" ] || fail "stage $stage: param_hash differs (threads '$want', mpi '$got')"
  [ "$json_lines" -eq 1 ] && [ "$summaries" -eq 1 ] || fail "stage $stage: expected output from rank 0 only"
  grep -q '"backend":"mpi"' <<<"$mpi_out" || fail "stage $stage: the JSON line does not say backend mpi"
  grep -q "\"ranks\":$np" <<<"$mpi_out" || fail "stage $stage: the JSON line does not say $np ranks"
  last_want=$want
done

# Through a modeled link (comm::modeled over comm::mpi): the same bits as threads without one.
got=$("$mpirun" --oversubscribe -np $np "$exe" --backend mpi --stage 3 "${steps[@]}" --link-gbps 1 \
        --link-latency-us 50 --json 2>/dev/null | tail -n1 | hash_of)
echo "stage 3 over a modeled link: mpi $got"
[ -n "$got" ] && [ "$got" = "$last_want" ] || fail "modeled link: param_hash '$got', threads without it '$last_want'"

# --reproducible --micro-batch 4: the 64 rows of a step at N = 2 and 4 MPI processes give the bits of
# one thread rank (bf16, clipped).
repro=(--reproducible --micro-batch 4 --clip 0.5 --precision bf16 "${steps[@]}" --json)
want=$("$exe" --backend threads --ranks 1 --stage 0 "${repro[@]}" 2>/dev/null | tail -n1 | hash_of)
for spec in "2 2" "4 3"; do
  set -- $spec
  got=$("$mpirun" --oversubscribe -np $1 "$exe" --backend mpi --stage $2 "${repro[@]}" 2>/dev/null | tail -n1 | hash_of)
  echo "reproducible: mpi -np $1 stage $2 $got, threads N=1 $want"
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "reproducible -np $1 stage $2: param_hash '$got', N=1 '$want'"
done

# Master weights and optimizer states on disk, one file per MPI process (comm::mpi, the disk tier):
# the same bits as threads in memory, at stage 1 and 3.
offload_dir=$(mktemp -d)
for stage in 1 3; do
  want=$("$exe" --backend threads --ranks $np --stage $stage "${steps[@]}" --json 2>/dev/null | tail -n1 | hash_of)
  got=$("$mpirun" --oversubscribe -np $np "$exe" --backend mpi --stage $stage "${steps[@]}" --offload disk \
          --offload-dir "$offload_dir" --json 2>/dev/null | tail -n1 | hash_of)
  echo "stage $stage, states on disk: mpi $got, threads in memory $want"
  [ -n "$got" ] && [ "$got" = "$want" ] || fail "offload to disk under MPI: param_hash '$got', threads '$want'"
done
[ -z "$(ls -A "$offload_dir")" ] || fail "the MPI ranks left offload files: $(ls "$offload_dir")"
rm -rf "$offload_dir"

# A --ranks equal to the communicator's size is accepted; a different one is refused.
"$mpirun" --oversubscribe -np $np "$exe" --backend mpi --ranks $np --steps 1 >/dev/null 2>&1 ||
  fail "--ranks $np under -np $np was refused"
out=$("$mpirun" --oversubscribe -np $np "$exe" --backend mpi --ranks 3 --steps 1 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "--ranks 3 under -np $np: exit code $rc, expected 2"
grep -q -- "--ranks 3" <<<"$out" || fail "--ranks 3 under -np $np: no message naming --ranks: $out"

[ $status -eq 0 ] && echo "ok"
exit $status
