#!/usr/bin/env bash
# Asynchronous checkpoints and memory release, measured against the step loop, memcpy and dd in one run.
#
# 1. bench_checkpoint (ranks on threads, stage 1, AdamW, MIB MiB of checkpoint per rank): a step alone;
#    a blocking save; an asynchronous save's stall against every rank copying the same bytes with
#    memcpy at once (target: stall <= 1.2x); the steps that run while the writers write against a
#    step alone (target: <= 1.15x); each rank's write rate; the same two through the page cache
#    (buffered_*: async_saver_options::direct_io off); release_memory/restore_memory to host and to disk
#    against memcpy of the same bytes.
# 2. dd: as many files as ranks, MIB MiB each, written at once with bs=4M and conv=fsync (the writer's
#    block and its fsync) into the same directory; the writers' rate over dd's (target: >= 0.7).
# 3. Under MPI (where built): train_mlp --backend mpi --save-async, its saves' stall and write rate.
# One JSON line per part into OUT (default bench/results/checkpoint.jsonl), each with the CPU and ISA.
#
# Usage: bench/checkpoint.sh [--build DIR] [--dir DIR] [--mib MIB] [--ranks N] [--out FILE.jsonl]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=$root/bench/results/checkpoint.jsonl
dir=""
mib=256
ranks=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--dir DIR] [--mib MIB] [--ranks N] [--out FILE.jsonl]" >&2; exit 2 ;;
  esac
done
bench=$build/bench/bench_checkpoint
[ -x "$bench" ] || { echo "no $bench: build it first (ninja -C $build bench/bench_checkpoint)" >&2; exit 1; }
source "$root/bench/timed_build.sh"
require_timed_build "$build" tools_optimization examples_optimization
scratch=""
if [ -z "$dir" ]; then scratch=$(mktemp -d "$root/build/checkpoint-bench.XXXXXX"); dir=$scratch; fi
trap '[ -z "$scratch" ] || rm -rf "$scratch"' EXIT
mkdir -p "$(dirname "$out")"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
isa=$(grep -qw avx512f /proc/cpuinfo && echo avx512 || { grep -qw avx2 /proc/cpuinfo && echo avx2 || echo baseline; })
cores=$(nproc)
meta="\"cpu\": \"$cpu\", \"isa\": \"$isa\", \"cores\": $cores"

# 1. The step loop, the saves and the release.
line=$("$bench" --dir "$dir/threads" --ranks "$ranks" --mib "$mib")
echo "${line%\}}, $meta}" | tee -a "$out"

# 2. dd: one file per rank, written at once, 4 MiB blocks, fsync at the end.
count=$(( (mib + 3) / 4 ))
start=$(date +%s.%N)
for r in $(seq 1 "$ranks"); do
  dd if=/dev/zero of="$dir/dd.$r" bs=4M count="$count" conv=fsync status=none &
done
wait
end=$(date +%s.%N)
rm -f "$dir"/dd.*
python3 - "$line" "$start" "$end" "$count" "$meta" <<'PY' | tee -a "$out"
import json, sys
b = json.loads(sys.argv[1])
seconds = float(sys.argv[3]) - float(sys.argv[2])
dd_rate = int(sys.argv[4]) * 4 * 2**20 / seconds  # per file: they ran at once, as the ranks' writers do
print(json.dumps({"bench": "checkpoint_dd", "dd_bytes_per_s_per_file": dd_rate,
                  "write_bytes_per_s": b["write_bytes_per_s"], "write_over_dd": b["write_bytes_per_s"] / dd_rate,
                  "buffered_write_over_dd": b["buffered_write_bytes_per_s"] / dd_rate,
                  **json.loads("{" + sys.argv[5] + "}")}))
PY

# 3. MPI: the trainer's saves, processes instead of threads.
if [ -x "$build/examples/train_mlp" ] && command -v mpirun >/dev/null &&
   "$build/examples/train_mlp" --help 2>/dev/null | grep -q -- '--backend'; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  rm -f "$dir/mpi.jsonl"
  if mpirun -np "$ranks" "$build/examples/train_mlp" --backend mpi --ranks "$ranks" --stage 1 --in 1024 \
       --hidden 2048 --layers 8 --batch 32 --steps 24 --save-every 6 --save "$dir/mpi" --save-async \
       --log "$dir/mpi.jsonl" >/dev/null 2>&1; then
    python3 - "$dir/mpi.jsonl" "$meta" <<'PY' | tee -a "$out"
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = {j["step"]: j["step_ms"] for j in lines if j["kind"] == "step"}
saves = [j for j in lines if j["kind"] == "save"]
after = [steps[s["step"] + 1] for s in saves if s["step"] + 1 in steps]  # the step right after each save
alone = [ms for st, ms in steps.items() if st > 2 and all(st != s["step"] + 1 for s in saves)]
print(json.dumps({"bench": "checkpoint_mpi", "saves": len(saves), "bytes_per_rank": saves[0]["bytes"],
                  "stall_ms": statistics.median(s["stall_s"] * 1e3 for s in saves),
                  "write_bytes_per_s": statistics.median(s["write_bytes_per_s"] for s in saves),
                  "step_ms": statistics.median(alone), "step_after_save_ms": statistics.median(after),
                  "step_after_save_ratio": statistics.median(after) / statistics.median(alone),
                  **json.loads("{" + sys.argv[2] + "}")}))
PY
  else
    echo '{"bench": "checkpoint_mpi", "skipped": "the MPI run failed"}' | tee -a "$out"
  fi
fi
