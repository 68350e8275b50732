#!/usr/bin/env bash
# train_mlp with ZeRO++ (--qwz, --qgz, --hpz, --node-size): bytes in total and between nodes equal
# their formulas; hpZ alone keeps stage 3's param_hash, qwZ + hpZ keeps qwZ's, qgZ gives stages 1-3 one
# hash; on a modeled link with overlap the same bits; the same inside replicated shard groups
# (--shard-group); meaningless combinations are usage errors.
# Usage: train_mlp_zeropp.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
common=(--json --ranks 4 --batch 16 --steps 4 --layers 3 --hidden 48)
# run HASH_VAR INTER_VAR FLAGS...: trains, checks both formulas, sets the param_hash and the bytes
# between nodes per rank and step. Runs that quantize use blocks of 64 (without --qwz or --qgz,
# --quant-block would do nothing: a usage error).
run() {
  local hash_var=$1 inter_var=$2
  shift 2
  local quant=()
  [[ " $* " == *" --qwz "* || " $* " == *" --qgz "* ]] && quant=(--quant-block 64)
  e2e_run "$train_mlp" "${common[@]}" "${quant[@]}" "$@"
  e2e_filter "$hash_var" hex python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["comm_inter_node_bytes_per_rank_per_step"] == j["comm_inter_node_formula_bytes"], j
print(j["param_hash"])'
  e2e_json "$inter_var" comm_inter_node_bytes_per_rank_per_step int
}
run plain plain_inter --node-size 2
run hpz hpz_inter --hpz 2
run qwz _ --qwz --node-size 2
run qwz_hpz _ --qwz --hpz 2
run all all_inter --qwz --qgz --qgz-bits 4 --hpz 2
run linked _ --qwz --qgz --qgz-bits 4 --hpz 2 --link-gbps 2 --overlap on
echo "stage 3 $plain ($plain_inter bytes between nodes), hpZ $hpz ($hpz_inter), qwZ $qwz, qwZ + hpZ $qwz_hpz," \
     "all three $all ($all_inter), on a modeled link $linked"
e2e_same "$hpz" "$plain" "hpZ against stage 3's param_hash"
e2e_same "$qwz_hpz" "$qwz" "qwZ + hpZ against qwZ's param_hash"
e2e_differ "$qwz" "$plain" "qwZ against stage 3's param_hash (qwZ must change the result)"
e2e_same "$linked" "$all" "the modeled link with overlap against the same run without it"
[ "$hpz_inter" -lt "$plain_inter" ] || e2e_fail "hpZ: $hpz_inter bytes between nodes, not below $plain_inter"
[ $((all_inter * 4)) -lt "$plain_inter" ] ||
  e2e_fail "qwZ + qgZ + hpZ: $all_inter bytes between nodes, not below a quarter of $plain_inter"
for stage in 1 2 3; do
  run h _ --stage $stage --qgz --node-size 2
  [ "$stage" = 1 ] && first=$h
  e2e_same "$h" "$first" "qgZ: stage $stage against stage 1"
done
# Inside replicated shard groups (HSDP x ZeRO++): 8 ranks in groups of 4, nodes of 2 within a group;
# both formulas hold, and hpZ still changes no bit.
common=(--json --ranks 8 --shard-group 4 --batch 16 --steps 4 --layers 3 --hidden 48)
run g_qwz _ --qwz --node-size 2
run g_qwz_hpz _ --qwz --hpz 2
run g_all _ --qwz --qgz --qgz-bits 4 --hpz 2
echo "in shard groups of 4: qwZ $g_qwz, qwZ + hpZ $g_qwz_hpz, all three $g_all"
e2e_same "$g_qwz_hpz" "$g_qwz" "qwZ + hpZ against qwZ's param_hash in shard groups"
e2e_differ "$g_all" "$all" "all three in shard groups of 4 against one group of 4 ranks"
# Meaningless combinations: usage errors (exit 2) that say why.
check_refused() { e2e_expect 2 "$1" "$train_mlp" --steps 1 "${@:2}"; }
check_refused "gathers no parameters" --stage 2 --qwz
check_refused "does not shard them" --stage 1 --hpz 2
check_refused "stage 0 all-reduces" --stage 0 --qgz
check_refused "does not divide the 4 ranks" --hpz 3
check_refused "the secondary partition the primary one" --hpz 4
check_refused "disagree on the node size" --hpz 2 --node-size 1
check_refused "must be even" --qgz --qgz-bits 4 --quant-block 63
echo "1 passed, 0 failed"
