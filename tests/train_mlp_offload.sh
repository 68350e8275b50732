#!/usr/bin/env bash
# train_mlp --offload host|disk: the param_hash of no offload at every stage; the tier's bytes and the
# bytes moved per step equal their formulas; a --state-memory-limit below the model states is refused
# without offload and trains with the disk tier; a disk too small for the tier is refused at start,
# naming the file (in a private mount namespace with a small tmpfs, where the machine allows one).
# Usage: train_mlp_offload.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
dir=$e2e_work/offload
mkdir "$dir"
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
print(j["param_hash"])' "$@"
}
# run VAR TIER FLAGS...: trains, checks the JSON line for TIER (none, host, disk), VAR = its hash.
run() {
  local var=$1 tier=$2
  shift 2
  e2e_run "$train_mlp" "$@"
  e2e_filter "$var" hex check "$tier"
}

for precision in fp32 bf16; do
  for stage in 0 1 2 3; do
    flags=("${common[@]}" --precision "$precision" --stage "$stage")
    run plain none "${flags[@]}"
    run host host "${flags[@]}" --offload host
    run disk disk "${flags[@]}" --offload disk --offload-dir "$dir" --offload-slice 1024
    echo "$precision stage $stage: param_hash $plain, host $host, disk $disk"
    e2e_same "$host" "$plain" "$precision stage $stage: --offload host against no offload"
    e2e_same "$disk" "$plain" "$precision stage $stage: --offload disk against no offload"
    [ -z "$(ls -A "$dir")" ] || e2e_fail "a run left its offload file in $dir: $(ls -l "$dir")"
  done
done

# A budget below the model states: refused up front without offload, trained with the disk tier.
# The budget is what the disk tier's run holds in memory at its peak without overlap (parameters,
# gradients, one unit gathered and its bucket: under a budget, overlap holds no more than that), which
# is well below the model states (bf16 + AdamW: 4 of their 16 bytes per parameter stay in memory).
big=(--json --ranks 2 --batch 8 --steps 4 --layers 16 --hidden 96 --in 96 --clip 1 --stage 3 --precision bf16)
run want none "${big[@]}"
e2e_json states model_state_bytes_per_rank int
e2e_run "$train_mlp" "${big[@]}" --offload disk --offload-dir "$dir" --overlap off
e2e_filter limit int python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(j["model_state_bytes_per_rank"] + j["transient_peak_bytes_per_rank"])'
[ $((limit * 2)) -lt "$states" ] || e2e_fail "the disk tier needs $limit bytes, not well below $states"
e2e_expect 1 "out of memory" "$train_mlp" "${big[@]}" --state-memory-limit "$limit"
run got disk "${big[@]}" --state-memory-limit "$limit" --offload disk --offload-dir "$dir"
e2e_json in_memory model_state_bytes_per_rank int
echo "model states $states bytes: refused under a limit of $limit; the disk tier keeps $in_memory in memory, param_hash $got"
e2e_same "$got" "$want" "the disk tier under a limit against no offload"

# Flags: --offload-dir needs --offload; a slice that is not a multiple of 1024 is refused.
e2e_run_rc "$train_mlp" --steps 1 --offload-dir "$dir"
[ "$e2e_rc" -ne 0 ] || e2e_fail "--offload-dir alone accepted"
e2e_run_rc "$train_mlp" --steps 1 --offload disk --offload-dir "$dir" --offload-slice 1500
[ "$e2e_rc" -ne 0 ] || e2e_fail "--offload-slice 1500 accepted"
grep -q "multiple of 1024" <<<"$e2e_err" || e2e_fail "no message for the slice: $e2e_err"

# A full disk: a 64 KiB tmpfs cannot hold the tier; the run ends at start with the file named.
if unshare --mount --propagation private true 2>/dev/null; then
  # The inner script reports the trainer's exit itself: a refusal is the expected outcome.
  e2e_run unshare --mount --propagation private bash -c '
    mkdir -p "$1/small" && mount -t tmpfs -o size=64k zero-offload "$1/small" || { echo "exit 77"; exit 0; }
    "$2" --json --ranks 2 --batch 8 --steps 2 --layers 3 --hidden 64 --in 96 --offload disk --offload-dir "$1/small" 2>&1
    echo "exit $?"' _ "$dir" "$train_mlp"
  out=$e2e_out
  case "$out" in
    *"exit 77"*) echo "disk full: skipped (no tmpfs mount here)" ;;
    *"cannot preallocate"*"offload file '$dir/small/zero-offload-rank"*"No space left on device"*"exit 1"*)
      echo "disk full: refused at start, naming the file" ;;
    *) e2e_fail "a full disk gave: $out" ;;
  esac
else
  echo "disk full: skipped (no private mount namespace here)"
fi
echo "PASS"
