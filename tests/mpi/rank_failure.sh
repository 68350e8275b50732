#!/bin/bash
# A rank that throws, returns early or arrives late ends the whole MPI job promptly, with
# "rank R failed: <cause>" and a failing exit code, never a hang.
# Usage: rank_failure.sh MPIRUN MPI_RANK_FAILURE
set -u
mpirun=$1
exe=$2
status=0
expect() {  # expect HOW PATTERN: the job fails within 30 s and its output matches PATTERN
  local how=$1 pattern=$2 start rc out
  start=$(date +%s)
  out=$(timeout 120 "$mpirun" --oversubscribe -np 3 "$exe" "$how" 2>&1)
  rc=$?
  local elapsed=$(($(date +%s) - start))
  if [ "$rc" -eq 124 ]; then
    echo "FAIL $how: the job hung until the 120 s limit"; status=1
  elif [ "$rc" -eq 0 ]; then
    echo "FAIL $how: the job succeeded although rank 1 misbehaved"; status=1
  elif [ "$elapsed" -gt 30 ]; then
    echo "FAIL $how: the job took ${elapsed}s to end"; status=1
  elif ! grep -Eq "$pattern" <<<"$out"; then
    echo "FAIL $how: no /$pattern/ in:"; echo "$out"; status=1
  else
    echo "ok   $how: exit $rc after ${elapsed}s: $(grep -Eo "$pattern.*" <<<"$out" | head -1)"
  fi
}
expect throw 'rank 1 failed: injected failure'
# Rank 1 is gone or asleep: a peer's all_reduce times out after 1 s and that rank ends the job.
expect return 'rank [02] failed: comm::mpi rank [02] of 3: all_reduce waited 1000 ms'
expect late 'rank [02] failed: comm::mpi rank [02] of 3: all_reduce waited 1000 ms'
exit $status
