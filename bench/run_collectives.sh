#!/usr/bin/env bash
# Runs the collective benchmark into bench/results/: memcpy; threads N=2,4; mpi N=2,4 in both modes,
# with polled nonblocking and with blocking collectives.
# Usage: bench/run_collectives.sh [BUILD_DIR]   (default: build/, or $ZERO_BUILD_DIR; configured if missing)
# Writes bench/results/collectives.jsonl and collectives.png, and prints a Markdown summary table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${ZERO_BUILD_DIR:-$root/build}}
results=$root/bench/results
out=$results/collectives.jsonl
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI containers run as root

[ -f "$build/build.ninja" ] || meson setup "$build" "$root" >&2
meson compile -C "$build" bench_collectives >&2
exe=$build/bench/bench_collectives
mkdir -p "$results"
: >"$out"

# Everything else on the machine competes for the same cores: say how busy it was.
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
step() { echo "== $*" >&2; }

step memcpy
"$exe" --backend memcpy >>"$out"
for n in 2 4; do
  step "threads N=$n"
  "$exe" --backend threads --ranks $n >>"$out"
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
step "memcpy again (the yardstick, after the collectives)"
"$exe" --backend memcpy >>"$out"

/usr/bin/python3 "$root/bench/plot_collectives.py" "$out" "$results/collectives.png" --table
echo "wrote $out and $results/collectives.png" >&2
