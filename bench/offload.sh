#!/usr/bin/env bash
# Offload, measured: the host tier's step against the in-memory step, and the disk tier's bytes per second against dd on the same file system with the same flags, in one run.
#
# 1. train_mlp at stage 3 on N ranks with --offload none, host and disk (the same param_hash):
#    the step and its optimizer part (time_optimizer_s: step() less its collectives, which is where
#    the tier's reads, updates and writes happen), and the bytes the disk tier moved per step.
# 2. dd on the offload directory: a file of the rank's tier size written and read back with
#    oflag=direct / iflag=direct (the engine's O_DIRECT; buffered when the file system refuses it,
#    as the engine falls back), block size = the engine's slice per array (4 MiB by default), into a
#    preallocated file like the engine's.
# The records: host_over_memory (step with --offload host / without), disk_throughput_gbps (every
# rank's bytes moved per step / the disk run's optimizer time, during which all ranks stream at once), dd_gbps (the same bytes over
# dd's write + read time, for as many files as ranks, one after the other), and
# disk_over_dd = disk / dd (target >= 0.7, issue 15 item 6).
#
# Usage: bench/offload.sh [--build DIR] [--dir OFFLOAD_DIR] [--out FILE.jsonl] [-- TRAIN_MLP_FLAGS...]
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=$root/bench/results/offload.jsonl
dir=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build DIR] [--dir OFFLOAD_DIR] [--out FILE.jsonl] [-- TRAIN_MLP_FLAGS...]" >&2; exit 2 ;;
  esac
done
train_mlp=$build/examples/train_mlp
[ -x "$train_mlp" ] || { echo "no $train_mlp: build it first (ninja -C $build examples/train_mlp)" >&2; exit 1; }
source "$root/bench/timed_build.sh"
require_timed_build "$build" examples_optimization
scratch=""
if [ -z "$dir" ]; then scratch=$(mktemp -d "$root/build/offload-bench.XXXXXX"); dir=$scratch; fi
trap '[ -z "$scratch" ] || rm -rf "$scratch"' EXIT
# 8 layers of 1024 x 1024 (8.4M parameters), fp32 AdamW: 67 MB of slots in the tier at N = 1.
model=(--in 1024 --hidden 1024 --layers 8 --batch 32 --steps "${ZERO_BENCH_STEPS:-6}" --stage 3
       --ranks "${ZERO_BENCH_RANKS:-1}")
mkdir -p "$(dirname "$out")"
: >"$out"

run() {
  "$train_mlp" --json "${model[@]}" "$@" "${extra[@]}" 2>/dev/null </dev/null | tail -n1
}
memory=$(run --offload none)
host=$(run --offload host)
disk=$(run --offload disk --offload-dir "$dir")
for j in "$memory" "$host" "$disk"; do
  python3 -c '
import json, sys
j = json.loads(sys.argv[1])
keep = ["stage", "ranks", "param_hash", "time_step_s", "time_optimizer_s", "offload", "offload_bytes_per_rank",
        "offload_moved_bytes_per_step", "offload_staging_bytes", "offload_direct_io"]
r = {"bench": "offload_run", "loadavg": sys.argv[2]}
r.update({k: j[k] for k in keep if k in j})
print(json.dumps(r))' "$j" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
done

# dd with the engine's flags, a file of one rank's tier size per rank, written then read.
read -r bytes direct ranks < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print(j["offload_bytes_per_rank"], int(j.get("offload_direct_io", False)), j["ranks"])' "$disk")
block=$((4 << 20))
count=$(((bytes + block - 1) / block))
oflag=(); iflag=()
if [ "$direct" = 1 ]; then oflag=(oflag=direct); iflag=(iflag=direct); fi
# Into preallocated files, as the engine's (its file is preallocated at construction), over the
# existing blocks (notrunc); buffered I/O ends with an fdatasync so that the bytes reached the disk.
sync_flag=(conv=notrunc,fdatasync)
[ "$direct" = 1 ] && sync_flag=(conv=notrunc)
for r in $(seq 1 "$ranks"); do fallocate -l $((block * count)) "$dir/dd.$r"; done
start=$(date +%s.%N)
for r in $(seq 1 "$ranks"); do
  dd if=/dev/zero of="$dir/dd.$r" bs="$block" count="$count" "${sync_flag[@]}" "${oflag[@]}" status=none
  dd if="$dir/dd.$r" of=/dev/null bs="$block" "${iflag[@]}" status=none
done
dd_s=$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)")
rm -f "$dir"/dd.*

python3 - "$memory" "$host" "$disk" "$dd_s" "$block" "$count" "$ranks" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out" <<'PY'
import json, sys
memory, host, disk = (json.loads(a) for a in sys.argv[1:4])
dd_s, block, count, ranks = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
assert memory["param_hash"] == host["param_hash"] == disk["param_hash"], "offload changed the bits"
moved = disk["offload_moved_bytes_per_step"] * ranks  # every rank's reads and writes
# The ranks' step() calls run at the same time (each rank streams its own file): all of their bytes
# move during one optimizer time (the mean over ranks).
disk_gbps = moved / disk["time_optimizer_s"] / 1e9
dd_gbps = 2 * block * count * ranks / dd_s / 1e9
r = {"bench": "offload_target", "ranks": ranks, "loadavg": sys.argv[8],
     "step_memory_ms": round(1e3 * memory["time_step_s"], 2), "step_host_ms": round(1e3 * host["time_step_s"], 2),
     "step_disk_ms": round(1e3 * disk["time_step_s"], 2),
     "optimizer_memory_ms": round(1e3 * memory["time_optimizer_s"], 2),
     "optimizer_disk_ms": round(1e3 * disk["time_optimizer_s"], 2),
     "host_over_memory": round(host["time_step_s"] / memory["time_step_s"], 3),
     "disk_moved_bytes_per_step": moved, "direct_io": disk.get("offload_direct_io"),
     "disk_throughput_gbps": round(disk_gbps, 3), "dd_gbps": round(dd_gbps, 3),
     "disk_over_dd": round(disk_gbps / dd_gbps, 3)}
print(json.dumps(r))
print(f"host tier: step {r['host_over_memory']} x the in-memory step; disk tier {r['disk_throughput_gbps']} GB/s "
      f"against dd {r['dd_gbps']} GB/s: {r['disk_over_dd']} (target >= 0.7: "
      f"{'met' if r['disk_over_dd'] >= 0.7 else 'missed'})", file=sys.stderr)
PY
tail -n1 "$out"
echo "wrote $out" >&2
