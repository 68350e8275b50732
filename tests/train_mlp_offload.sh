#!/usr/bin/env bash
# train_mlp --offload host|disk: the param_hash of no offload at every stage; the tier's bytes and the
# bytes moved per step equal their formulas; a --state-memory-limit below the model states is refused
# without offload (the message naming the disk tier, which would fit) and trains with the disk tier,
# whose slice buffers count within the limit; a disk too small for the tier is refused at start,
# naming the directory (in a private mount namespace with a small tmpfs, where the machine allows one);
# the offload directory holds no entry while a run lives, and none after SIGKILL or SIGTERM (threads,
# and mpirun -np 2 where MPI is built).
# Usage: train_mlp_offload.sh TRAIN_MLP
set -eu
train_mlp=$1
dir=$(mktemp -d)
running=""
trap '[ -z "$running" ] || kill -9 $running 2>/dev/null || true; rm -rf "$dir"' EXIT
common=(--json --ranks 2 --batch 8 --steps 4 --layers 3 --hidden 64 --in 96 --clip 1)

# Prints the hash; with an offload, checks its formulas and the tier it names.
check() {
  python3 -c '
import json, sys
tier = sys.argv[1]
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
if tier == "none":
    assert "offload" not in j, j
else:
    assert j["offload"] == tier, j
    assert j["offload_bytes_per_rank"] == j["offload_formula_bytes"] > 0, j
    assert j["offload_moved_bytes_per_step"] == j["offload_moved_formula_bytes"], j
    if tier == "disk":
        assert j["offload_moved_bytes_per_step"] == 2 * j["offload_bytes_per_rank"], j  # read and written once
        assert j["offload_staging_bytes"] > 0, j
print(j["param_hash"], j["model_state_bytes_per_rank"])' "$@"
}

for precision in fp32 bf16; do
  for stage in 0 1 2 3; do
    flags=("${common[@]}" --precision "$precision" --stage "$stage")
    read -r plain states < <("$train_mlp" "${flags[@]}" 2>/dev/null | check none)
    read -r host _ < <("$train_mlp" "${flags[@]}" --offload host 2>/dev/null | check host)
    read -r disk _ < <("$train_mlp" "${flags[@]}" --offload disk --offload-dir "$dir" --offload-slice 1024 2>/dev/null |
                       check disk)
    echo "$precision stage $stage: param_hash $plain, host $host, disk $disk"
    [ "$plain" = "$host" ] && [ "$plain" = "$disk" ] || { echo "FAIL: offload changed the result"; exit 1; }
    [ -z "$(ls -A "$dir")" ] || { echo "FAIL: a run left its offload file in $dir"; ls -l "$dir"; exit 1; }
  done
done

# A budget below the model states: refused up front without offload, trained with the disk tier.
# The budget is what the disk tier's run holds in memory at its peak without overlap (parameters,
# gradients, one unit gathered and its bucket: under a budget, overlap holds no more than that), which
# is well below the model states (bf16 + AdamW: 4 of their 16 bytes per parameter stay in memory).
big=(--json --ranks 2 --batch 8 --steps 4 --layers 16 --hidden 96 --in 96 --clip 1 --stage 3 --precision bf16)
read -r want states < <("$train_mlp" "${big[@]}" 2>/dev/null | check none)
# Slices of 1024 elements: the tier's slice buffers (counted within the limit) stay small.
limit=$("$train_mlp" "${big[@]}" --offload disk --offload-dir "$dir" --offload-slice 1024 --overlap off 2>/dev/null |
        tail -n1 | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
assert 0 < j["offload_staging_bytes"] < j["offload_memory_bytes_per_rank"], j  # slice sets and checksums
print(j["model_state_bytes_per_rank"] + j["transient_peak_bytes_per_rank"] + j["offload_memory_bytes_per_rank"])')
[ $((limit * 2)) -lt "$states" ] || { echo "FAIL: the disk tier needs $limit bytes, not well below $states"; exit 1; }
if "$train_mlp" "${big[@]}" --state-memory-limit "$limit" >"$dir/out" 2>"$dir/err"; then
  echo "FAIL: model states of $states bytes trained under a $limit byte limit"; exit 1
fi
grep -q "out of memory" "$dir/err" || { echo "FAIL: no out-of-memory message:"; cat "$dir/err"; exit 1; }
grep -q "With offload (engine_options::offload, tier disk: .* bytes of host memory .*offload.slice_elements = 1024).*which fit" \
  "$dir/err" || { echo "FAIL: the refusal does not name the disk tier that would fit:"; cat "$dir/err"; exit 1; }
read -r got in_memory < <("$train_mlp" "${big[@]}" --state-memory-limit "$limit" --offload disk \
                            --offload-dir "$dir" --offload-slice 1024 2>/dev/null | check disk)
echo "model states $states bytes: refused under a limit of $limit; the disk tier keeps $in_memory in memory, param_hash $got"
[ "$got" = "$want" ] || { echo "FAIL: the disk tier under a limit changed the result"; exit 1; }
# The default slice (2^20 elements) stages this small state whole: that counts, and is refused.
if "$train_mlp" "${big[@]}" --state-memory-limit "$limit" --offload disk --offload-dir "$dir" >"$dir/out" 2>"$dir/err"; then
  echo "FAIL: the disk tier's slice buffers were not counted within the limit"; exit 1
fi
grep -q "out of memory.*offload [0-9]" "$dir/err" || { echo "FAIL: the refusal does not name offload:"; cat "$dir/err"; exit 1; }
echo "the default slice stages the small state whole: refused under $limit, naming offload"

# Flags: --offload-dir needs --offload; a slice that is not a multiple of 1024 is refused.
if "$train_mlp" --steps 1 --offload-dir "$dir" >/dev/null 2>&1; then echo "FAIL: --offload-dir alone accepted"; exit 1; fi
if "$train_mlp" --steps 1 --offload disk --offload-dir "$dir" --offload-slice 1500 >/dev/null 2>"$dir/err"; then
  echo "FAIL: --offload-slice 1500 accepted"; exit 1
fi
grep -q "multiple of 1024" "$dir/err" || { echo "FAIL: no message for the slice:"; cat "$dir/err"; exit 1; }
rm -f "$dir/err" "$dir/out"

# A full disk: a 64 KiB tmpfs cannot hold the tier; the run ends at start with the file named.
if unshare --mount --propagation private true 2>/dev/null; then
  out=$(unshare --mount --propagation private bash -c '
    mkdir -p "$1/small" && mount -t tmpfs -o size=64k zero-offload "$1/small" || exit 77
    "$2" --json --ranks 2 --batch 8 --steps 2 --layers 3 --hidden 64 --in 96 --offload disk --offload-dir "$1/small" 2>&1
    echo "exit $?"' _ "$dir" "$train_mlp") || true
  case "$out" in
    *"exit 77"*) echo "disk full: skipped (no tmpfs mount here)" ;;
    *"cannot preallocate"*"offload file (anonymous file of rank "*" in '$dir/small')"*"No space left on device"*"exit 1"*)
      echo "disk full: refused at start, naming the directory" ;;
    *) echo "FAIL: a full disk gave:"; echo "$out"; exit 1 ;;
  esac
else
  echo "disk full: skipped (no private mount namespace here)"
fi
# Killed runs leave nothing: the file never has a name, and the kernel frees it with the process.
# Each run is killed once its log shows a step (the tier is live: its descriptor is open on an
# anonymous file in the directory, which has no entry), so the kill lands mid-run, not after it.
# killed_run SIGNAL LABEL "TRAIN_MLP FLAGS" [LAUNCHER...]
killed_run() {
  local sig=$1 label=$2 rank_flags=$3; shift 3
  local d="$dir/killed-$label" log="$dir/killed-$label.log"
  mkdir "$d"
  # shellcheck disable=SC2086
  "$@" "$train_mlp" $rank_flags --batch 8 --steps 1000000 --layers 3 --hidden 64 --in 96 --offload disk \
    --offload-dir "$d" --offload-slice 1024 --log "$log" >/dev/null 2>&1 &
  running=$!
  for _ in $(seq 600); do [ -s "$log" ] && break; sleep 0.1; done
  [ -s "$log" ] || { echo "FAIL: $label: no step logged"; exit 1; }
  [ -z "$(ls -A "$d")" ] || { echo "FAIL: $label: the offload directory has entries while the run lives:"; ls -la "$d"; exit 1; }
  # The ranks: the process itself (threads), or mpirun's children (one process per rank).
  local pids=$running
  if [ $# -gt 0 ]; then pids=$(ps -o pid= --ppid "$running" | tr -d ' '); fi
  local live=0
  for p in $pids; do
    for fd in /proc/"$p"/fd/*; do
      case "$(readlink "$fd" 2>/dev/null)" in "$d/"*" (deleted)") live=$((live + 1)) ;; esac
    done
  done
  [ "$live" -ge 1 ] || { echo "FAIL: $label: no live offload file found in $pids"; exit 1; }
  kill "-$sig" "$(echo "$pids" | tail -n1)"  # under MPI one rank: mpirun then ends the others
  wait "$running" 2>/dev/null || true
  running=""
  [ -z "$(ls -A "$d")" ] || { echo "FAIL: $label: SIG$sig left files:"; ls -la "$d"; exit 1; }
  echo "SIG$sig ($label) mid-run: $live live anonymous file(s), nothing left in the directory"
}
killed_run KILL threads "--ranks 2"
killed_run TERM threads-term "--ranks 2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np 2 --oversubscribe)
if command -v mpirun >/dev/null &&
   "${mpi[@]}" "$train_mlp" --backend mpi --steps 1 --batch 8 --layers 1 --hidden 8 --in 8 >/dev/null 2>&1; then
  killed_run KILL mpi "--backend mpi" "${mpi[@]}"
else
  echo "SIGKILL under MPI: skipped (no mpirun, or train_mlp built without MPI)"
fi
echo "PASS"
