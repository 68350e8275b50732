#!/usr/bin/env bash
# train_mlp --offload host|disk: the param_hash of no offload at every stage; the tier's bytes and the
# bytes moved per step equal their formulas; a --state-memory-limit below the model states is refused
# without offload and trains with the disk tier; a disk too small for the tier is refused at start,
# naming the file (in a private mount namespace with a small tmpfs, where the machine allows one).
# Usage: train_mlp_offload.sh TRAIN_MLP
set -eu
train_mlp=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
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
limit=$("$train_mlp" "${big[@]}" --offload disk --offload-dir "$dir" --overlap off 2>/dev/null | tail -n1 | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
print(j["model_state_bytes_per_rank"] + j["transient_peak_bytes_per_rank"])')
[ $((limit * 2)) -lt "$states" ] || { echo "FAIL: the disk tier needs $limit bytes, not well below $states"; exit 1; }
if "$train_mlp" "${big[@]}" --state-memory-limit "$limit" >"$dir/out" 2>"$dir/err"; then
  echo "FAIL: model states of $states bytes trained under a $limit byte limit"; exit 1
fi
grep -q "out of memory" "$dir/err" || { echo "FAIL: no out-of-memory message:"; cat "$dir/err"; exit 1; }
read -r got in_memory < <("$train_mlp" "${big[@]}" --state-memory-limit "$limit" --offload disk \
                            --offload-dir "$dir" 2>/dev/null | check disk)
echo "model states $states bytes: refused under a limit of $limit; the disk tier keeps $in_memory in memory, param_hash $got"
[ "$got" = "$want" ] || { echo "FAIL: the disk tier under a limit changed the result"; exit 1; }

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
    *"cannot preallocate"*"offload file '$dir/small/zero-offload-rank"*"No space left on device"*"exit 1"*)
      echo "disk full: refused at start, naming the file" ;;
    *) echo "FAIL: a full disk gave:"; echo "$out"; exit 1 ;;
  esac
else
  echo "disk full: skipped (no private mount namespace here)"
fi
echo "PASS"
