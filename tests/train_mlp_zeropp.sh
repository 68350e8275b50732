#!/usr/bin/env bash
# train_mlp with ZeRO++ (--qwz, --qgz, --hpz, --node-size): bytes in total and between nodes equal
# their formulas; hpZ alone keeps stage 3's param_hash, qwZ + hpZ keeps qwZ's, qgZ gives stages 1-3 one
# hash; on a modeled link with overlap the same bits; meaningless combinations are usage errors.
# Usage: train_mlp_zeropp.sh TRAIN_MLP
set -eu
train_mlp=$1
common=(--json --ranks 4 --batch 16 --steps 4 --layers 3 --hidden 48)
# Prints the param_hash; checks both formulas. Runs that quantize use blocks of 64 (without --qwz or
# --qgz, --quant-block would do nothing: a usage error).
run() {
  local quant=()
  [[ " $* " == *" --qwz "* || " $* " == *" --qgz "* ]] && quant=(--quant-block 64)
  "$train_mlp" "${common[@]}" "${quant[@]}" "$@" 2>/dev/null | python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["comm_inter_node_bytes_per_rank_per_step"] == j["comm_inter_node_formula_bytes"], j
print(j["param_hash"], j["comm_inter_node_bytes_per_rank_per_step"])'
}
read -r plain plain_inter <<<"$(run --node-size 2)"
read -r hpz hpz_inter <<<"$(run --hpz 2)"
read -r qwz _ <<<"$(run --qwz --node-size 2)"
read -r qwz_hpz _ <<<"$(run --qwz --hpz 2)"
read -r all all_inter <<<"$(run --qwz --qgz --qgz-bits 4 --hpz 2)"
read -r linked _ <<<"$(run --qwz --qgz --qgz-bits 4 --hpz 2 --link-gbps 2 --overlap on)"
echo "stage 3 $plain ($plain_inter bytes between nodes), hpZ $hpz ($hpz_inter), qwZ $qwz, qwZ + hpZ $qwz_hpz," \
     "all three $all ($all_inter), on a modeled link $linked"
[ "$hpz" = "$plain" ] || { echo "FAIL: hpZ changed stage 3's result"; exit 1; }
[ "$qwz_hpz" = "$qwz" ] || { echo "FAIL: hpZ changed qwZ's result"; exit 1; }
[ "$qwz" != "$plain" ] || { echo "FAIL: qwZ left the result unchanged"; exit 1; }
[ "$linked" = "$all" ] || { echo "FAIL: the modeled link with overlap changed the result"; exit 1; }
[ "$hpz_inter" -lt "$plain_inter" ] && [ $((all_inter * 4)) -lt "$plain_inter" ] ||
  { echo "FAIL: bytes between nodes did not fall"; exit 1; }
for stage in 1 2 3; do
  read -r h _ <<<"$(run --stage $stage --qgz --node-size 2)"
  [ "$stage" = 1 ] && first=$h
  [ "$h" = "$first" ] || { echo "FAIL: qgZ: stage $stage $h, stage 1 $first"; exit 1; }
done
# Meaningless combinations: usage errors (exit 2) that say why.
check_refused() {
  set +e
  out=$("$train_mlp" --steps 1 "${@:2}" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && grep -q -- "$1" <<<"$out" || { echo "FAIL: ${*:2}: exit $rc: $out"; exit 1; }
}
check_refused "gathers no parameters" --stage 2 --qwz
check_refused "does not shard them" --stage 1 --hpz 2
check_refused "stage 0 all-reduces" --stage 0 --qgz
check_refused "does not divide the 4 ranks" --hpz 3
check_refused "the secondary partition the primary one" --hpz 4
check_refused "disagree on the node size" --hpz 2 --node-size 1
check_refused "must be even" --qgz --qgz-bits 4 --quant-block 63
echo "1 passed, 0 failed"
