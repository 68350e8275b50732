#!/usr/bin/env bash
# train_mlp --reproducible --micro-batch K: the same param_hash at N = 1, 2, 4, 8 (stages and precisions
# mixed), a checkpoint saved at one N and stage resumed at another equal to the uninterrupted run, the
# traffic and memory formulas, and the flags' refusals.
# Usage: train_mlp_reproducible.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
work=$e2e_work
# 48 rows per step in micro-batches of 6: M = 8 / N; clipping on.
common=(--layers 3 --hidden 48 --batch 48 --micro-batch 6 --reproducible --clip 0.5 --json)

run() { e2e_run "$train_mlp" "${common[@]}" "$@"; }

for precision in fp32 bf16; do
  run --ranks 1 --stage 0 --precision $precision --steps 12
  e2e_json want param_hash hex
  for spec in "2 1" "4 2" "8 3" "4 3" "2 0"; do
    set -- $spec
    run --ranks $1 --stage $2 --precision $precision --steps 12
    e2e_json got param_hash hex
    echo "$precision N=$1 stage $2: $got (N=1 stage 0: $want)"
    e2e_same "$got" "$want" "$precision N=$1 stage $2: param_hash against N=1's"
    python3 - "$e2e_out" <<'PY' || e2e_fail "$precision N=$1 stage $2: formulas"
import json, sys
j = json.loads(sys.argv[1].strip().splitlines()[-1])
assert j["reproducible"] is True, j
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
assert j["accum"] == 48 // 6 // j["ranks"], j
PY
  done
done
# Replicated shard groups (--shard-group, HSDP): plain ZeRO's bits, the formulas with the traffic across
# the groups counted between nodes.
for spec in "4 3 2" "8 2 4" "4 0 1"; do
  set -- $spec
  run --ranks $1 --stage $2 --shard-group $3 --precision bf16 --steps 12
  e2e_json got param_hash hex
  echo "bf16 N=$1 stage $2 in groups of $3: $got (N=1 stage 0: $want)"
  e2e_same "$got" "$want" "bf16 N=$1 stage $2 --shard-group $3: param_hash against N=1's"
  python3 - "$e2e_out" <<'PY' || e2e_fail "N=$1 stage $2 --shard-group $3: formulas"
import json, sys
j = json.loads(sys.argv[1].strip().splitlines()[-1])
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["comm_inter_node_bytes_per_rank_per_step"] == j["comm_inter_node_formula_bytes"] > 0, j
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
PY
done
e2e_expect 2 "--shard-group 3 does not divide the 4 data-parallel ranks" "$train_mlp" --shard-group 3 --ranks 4 --steps 1

# fp16: loss-scale decisions (skipped steps) the same at every N.
run --ranks 1 --stage 2 --precision fp16 --steps 12
e2e_json a_hash param_hash hex
e2e_json a_overflow overflow_steps int
run --ranks 4 --stage 3 --precision fp16 --steps 12
e2e_json b_hash param_hash hex
e2e_json b_overflow overflow_steps int
e2e_same "$b_hash" "$a_hash" "fp16: param_hash at N=4 against N=1"
e2e_same "$b_overflow" "$a_overflow" "fp16: overflow steps at N=4 against N=1"
echo "fp16 N=1 and N=4: $a_hash, $a_overflow overflow step(s)"

# The default mode is not the same at another N with the same micro-batches: the test above means something.
e2e_run "$train_mlp" --layers 3 --hidden 48 --batch 48 --micro-batch 6 --json --ranks 1 --steps 12
e2e_json d1 param_hash hex
e2e_run "$train_mlp" --layers 3 --hidden 48 --batch 48 --micro-batch 6 --json --ranks 4 --steps 12
e2e_json d4 param_hash hex
e2e_differ "$d1" "$d4" "the default mode at N=1 and N=4 (equal: the check has no power)"

# Saved after 6 steps at N=4 stage 3, resumed at N=2 stage 1 for 6 more: the uninterrupted run's bits.
run --ranks 4 --stage 3 --steps 6 --save "$work/ck"
run --ranks 2 --stage 1 --steps 6 --resume "$work/ck"
e2e_json resumed param_hash hex
run --ranks 8 --stage 2 --steps 12
e2e_json straight param_hash hex
echo "resumed at N=2 stage 1 after 6 steps at N=4 stage 3: $resumed; uninterrupted at N=8 stage 2: $straight"
e2e_same "$resumed" "$straight" "the resume at another N against the uninterrupted run"
# The same through shard groups: saved by N=4 in groups of 2, resumed at N=8 in groups of 4; and the
# plain checkpoint resumed at N=4 in groups of 2.
run --ranks 4 --stage 2 --shard-group 2 --steps 6 --save "$work/ck_groups"
run --ranks 8 --stage 3 --shard-group 4 --steps 6 --resume "$work/ck_groups"
e2e_json resumed_groups param_hash hex
e2e_same "$resumed_groups" "$straight" "the resume through shard groups against the uninterrupted run"
run --ranks 4 --stage 1 --shard-group 2 --steps 6 --resume "$work/ck"
e2e_json plain_into_groups param_hash hex
e2e_same "$plain_into_groups" "$straight" "a plain checkpoint resumed in shard groups against the uninterrupted run"

# Refusals, exit code 2 with a message naming the flags.
e2e_expect 2 "--reproducible requires --micro-batch" "$train_mlp" --reproducible --steps 1
e2e_expect 2 "must be a multiple of --ranks 4 times --micro-batch 5" "$train_mlp" --batch 48 --micro-batch 5 --ranks 4 \
  --steps 1
e2e_expect 2 "--accum excludes --micro-batch" "$train_mlp" --micro-batch 4 --accum 2 --steps 1
e2e_expect 2 "--reproducible keeps the bits at any world size" "$train_mlp" --reproducible --micro-batch 4 --qgz \
  --ranks 2 --steps 1
e2e_expect 2 "--reproducible keeps the bits at any world size" "$train_mlp" --reproducible --micro-batch 4 --qwz \
  --ranks 2 --steps 1

# Master weights and moments on disk keep the bits.
mkdir "$work/offload"
run --ranks 2 --stage 3 --steps 12 --offload disk --offload-dir "$work/offload"
e2e_json offload param_hash hex
echo "states on disk at N=2: $offload; uninterrupted at N=8: $straight"
e2e_same "$offload" "$straight" "--offload disk against the states in memory"
echo ok
