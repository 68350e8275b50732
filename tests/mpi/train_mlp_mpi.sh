#!/bin/bash
# train_mlp --backend mpi under mpirun -np 4 prints the threads backend's param_hash for every stage;
# only rank 0 prints; a --ranks that contradicts the communicator is a usage error (exit 2).
# Usage: train_mlp_mpi.sh MPIRUN TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
mpirun=$1
exe=$2
np=4
steps=(--steps 25)
mpi=("$mpirun" --oversubscribe -np $np "$exe" --backend mpi)

# threads VAR FLAGS... / mpi_run VAR FLAGS...: VAR = the param_hash of a run with FLAGS.
threads() {
  local var=$1
  shift
  e2e_run "$exe" --backend threads "$@" --json
  e2e_json "$var" param_hash hex
}
mpi_run() {
  local var=$1
  shift
  e2e_run "${mpi[@]}" "$@" --json
  e2e_json "$var" param_hash hex
}

for stage in 0 1 2 3; do
  threads want --ranks $np --stage $stage "${steps[@]}"
  mpi_run got --stage $stage "${steps[@]}"
  e2e_json ranks ranks int
  e2e_json backend backend
  json_lines=$(grep -c '^{' <<<"$e2e_out" || true)
  summaries=$(grep -c '^ZeRO stage' <<<"$e2e_out" || true)
  echo "stage $stage: threads $want, mpi $got ($json_lines JSON line, $summaries summary)"
  e2e_same "$got" "$want" "stage $stage: param_hash under MPI against threads"
  [ "$json_lines" -eq 1 ] && [ "$summaries" -eq 1 ] || e2e_fail "stage $stage: expected output from rank 0 only"
  e2e_same "$backend" mpi "stage $stage: the JSON line's backend"
  e2e_same "$ranks" $np "stage $stage: the JSON line's ranks"
  last_want=$want
done

# Through a modeled link (comm::modeled over comm::mpi): the same bits as threads without one.
mpi_run got --stage 3 "${steps[@]}" --link-gbps 1 --link-latency-us 50
echo "stage 3 over a modeled link: mpi $got"
e2e_same "$got" "$last_want" "stage 3 over a modeled link under MPI against threads without one"

# --reproducible --micro-batch 4: the 64 rows of a step at N = 2 and 4 MPI processes give the bits of
# one thread rank (bf16, clipped).
repro=(--reproducible --micro-batch 4 --clip 0.5 --precision bf16 "${steps[@]}")
threads want --ranks 1 --stage 0 "${repro[@]}"
for spec in "2 2" "4 3"; do
  set -- $spec
  e2e_run "$mpirun" --oversubscribe -np $1 "$exe" --backend mpi --stage $2 "${repro[@]}" --json
  e2e_json got param_hash hex
  echo "reproducible: mpi -np $1 stage $2 $got, threads N=1 $want"
  e2e_same "$got" "$want" "reproducible -np $1 stage $2 against threads N=1"
done

# Master weights and optimizer states on disk, one file per MPI process (comm::mpi, the disk tier):
# the same bits as threads in memory, at stage 1 and 3.
offload_dir=$e2e_work/offload
mkdir "$offload_dir"
for stage in 1 3; do
  threads want --ranks $np --stage $stage "${steps[@]}"
  mpi_run got --stage $stage "${steps[@]}" --offload disk --offload-dir "$offload_dir"
  echo "stage $stage, states on disk: mpi $got, threads in memory $want"
  e2e_same "$got" "$want" "stage $stage: offload to disk under MPI against threads"
done
[ -z "$(ls -A "$offload_dir")" ] || e2e_fail "the MPI ranks left offload files: $(ls "$offload_dir")"

# A --ranks equal to the communicator's size is accepted; a different one is refused.
e2e_run "${mpi[@]}" --ranks $np --steps 1
e2e_expect 2 "--ranks 3" "${mpi[@]}" --ranks 3 --steps 1
echo "ok"
