#!/usr/bin/env bash
# Runs the collective benchmark into bench/results/: memcpy; threads N=2,4 (with the per-call latency of a
# 1 KiB all_reduce); mpi N=2,4 in both modes, with polled nonblocking and with blocking collectives.
# Usage: bench/run_collectives.sh [BUILD_DIR]   (default: build/, or $ZERO_BUILD_DIR; configured if missing)
# ZERO_BENCH_RUNS=R repeats the memcpy and threads part R times (default 1; records carry "run"), so
# that the summary can give the run-to-run spread on a shared machine.
# Writes bench/results/collectives.jsonl and collectives.png, prints a Markdown summary table, and
# appends to the JSON lines (and prints) one "target" record per comm::threads target of
# docs/performance.md: the 1 KiB all_reduce median at N = 2 and 4, and busbw at 64 MiB over memcpy for
# all_reduce, reduce_scatter and all_gather at N = 2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${ZERO_BUILD_DIR:-$root/build}}
results=$root/bench/results
out=$results/collectives.jsonl
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI containers run as root

[ -f "$build/build.ninja" ] || meson setup "$build" "$root" >&2
source "$root/bench/timed_build.sh"
require_timed_build "$build" tools_optimization
meson compile -C "$build" bench_collectives >&2
exe=$build/bench/bench_collectives
mkdir -p "$results"
: >"$out"

# Everything else on the machine competes for the same cores: say how busy it was.
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
step() { echo "== $*" >&2; }

runs=${ZERO_BENCH_RUNS:-1}
# Tags every record of run $1 (a JSON object per line).
tag() { sed "s/^{/{\"run\":$1,/"; }
for run in $(seq 1 "$runs"); do
  step "run $run of $runs: memcpy (load average $(cut -d' ' -f1 /proc/loadavg))"
  "$exe" --backend memcpy | tag "$run" >>"$out"
  for n in 2 4; do
    step "run $run of $runs: threads N=$n"
    "$exe" --backend threads --ranks $n --latency-calls 20000 | tag "$run" >>"$out"
  done
  step "run $run of $runs: memcpy again"
  "$exe" --backend memcpy | tag "$run" >>"$out"
done
probe=(--backend mpi --min-bytes 1024 --max-bytes 1024)  # fails when built without MPI
if command -v mpirun >/dev/null && mpirun -np 1 "$exe" "${probe[@]}" >/dev/null 2>&1; then
  # Both modes, each with the default timeout (nonblocking collectives polled against a deadline)
  # and with none (MPI's blocking collectives, MPI's own algorithm choice).
  for n in 2 4; do
    for mode in deterministic fast; do
      for blocking in "" --blocking; do
        step "mpi $mode N=$n $blocking"
        mpirun --oversubscribe -np $n "$exe" --backend mpi --mode $mode $blocking >>"$out"
      done
    done
  done
else
  echo "no mpirun or bench_collectives built without MPI: skipping the mpi backend" >&2
fi
/usr/bin/python3 "$root/bench/plot_collectives.py" "$out" "$results/collectives.png" --table
/usr/bin/python3 "$root/bench/plot_collectives.py" "$out" --targets | tee -a "$out"
echo "wrote $out and $results/collectives.png" >&2
