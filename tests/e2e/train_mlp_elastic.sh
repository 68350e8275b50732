#!/usr/bin/env bash
# train_mlp --elastic on threads: a rank planted to fail (--fail RANK:STEP) at a step drawn at random, the run
# going on at N - 1 from its newest checkpoint (on disk, or half the cases a peer snapshot in the ranks' memory,
# --snapshot-every, with no --save) and back to N at --rejoin-step, ends with the param_hash of the run that
# never failed (--reproducible) in every stage, fp32 and bf16, with and without --offload host; the JSON records
# each change, the steps redone and where the next world went on from; a second failure during the recovery
# ends the run with an error and leaves the checkpoints loadable; a rank lost with the one holding its copy
# falls back to the disk, or ends the run when there is none; a world that grows by ranks never in the run
# (--grow), alone and with a failure and a rejoin, to the same bits, from disk and from memory; the refusals.
# Usage: train_mlp_elastic.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
work=$e2e_work
# 24 rows per step in micro-batches of 2: 3 per rank at N = 4, 4 at N = 3, 6 at N = 2.
common=(--layers 3 --hidden 48 --batch 24 --micro-batch 2 --reproducible --steps 12 --json)
seed=${ELASTIC_SEED:-$RANDOM}
echo "failure steps drawn with seed $seed (ELASTIC_SEED=$seed repeats them)"
RANDOM=$seed

# The membership changes of the last run's JSON, as "kind from->to at resumed redone" lines.
changes() {
  e2e_filter "$1" any python3 -c '
import json, sys
e = json.loads(sys.stdin.read().strip().splitlines()[-1])["elastic"]
assert e["launches"] == len(e["changes"]) + 1, e
for c in e["changes"]:
    assert c["steps_redone"] == c["at_step"] - c["resumed_at"], c
    assert c["recovery_s"] is not None and c["recovery_s"] >= 0, c
    print("%s %d->%d at %d from %d redone %d" % (c["kind"], c["from"], c["to"], c["at_step"], c["resumed_at"],
                                                  c["steps_redone"]))
'
}
# Where each next world of the last run went on from ("memory", "checkpoint", "start"), on one line.
sources() {
  e2e_filter "$1" any python3 -c '
import json, sys
print(" ".join(c["source"] for c in json.loads(sys.stdin.read().strip().splitlines()[-1])["elastic"]["changes"]))
'
}

case_no=0
for precision in fp32 bf16; do
  for stage in 0 1 2 3; do
    e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage $stage --precision $precision
    e2e_json want param_hash hex
    offload=()
    case_no=$((case_no + 1))
    # Half the cases with the optimizer's state in host memory (stages 1-3: the tier needs shards).
    if [ $stage -gt 0 ] && [ $((case_no % 2)) -eq 0 ]; then offload=(--offload host); fi
    fail_step=$((2 + RANDOM % 8))  # steps 2-9: a checkpoint every 3 steps before it, or none yet
    rank=$((RANDOM % 4))
    # Peer snapshots in memory at fp32 stages 2-3 and bf16 stages 0-1 (each with and without offload), no
    # file system; checkpoints on disk in the other cases.
    source=checkpoint
    saving=(--save "$work/ckpt" --save-every 3)
    if { [ $precision = fp32 ] && [ $stage -ge 2 ]; } || { [ $precision = bf16 ] && [ $stage -lt 2 ]; }; then
      source=memory
      saving=(--snapshot-every 3)
    fi
    rm -rf "$work/ckpt"
    e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage $stage --precision $precision "${offload[@]}" \
      "${saving[@]}" --elastic --fail "$rank:$fail_step" --rejoin-step 11
    e2e_json got param_hash hex
    changes seen
    sources from
    done_before=$((fail_step - 1))
    resumed=$((done_before / 3 * 3))
    expected="shrink 4->3 at $done_before from $resumed redone $((done_before - resumed))"$'\n'"grow 3->4 at 11 from 11 redone 0"
    [ $resumed -eq 0 ] && first=start || first=$source
    echo "$precision stage $stage ${offload[*]} ($source): rank $rank failed at step $fail_step: $got (uninterrupted: $want)"
    e2e_same "$seen" "$expected" "$precision stage $stage: the membership changes"
    e2e_same "$from" "$first $source" "$precision stage $stage: where the next worlds went on from"
    if [ $source = memory ] && [ -e "$work/ckpt" ]; then e2e_fail "$precision stage $stage: memory only, yet $work/ckpt exists"; fi
    e2e_same "$got" "$want" "$precision stage $stage ${offload[*]}: param_hash after 4 -> 3 -> 4 against the uninterrupted run"
    grep -Eq "^elastic: rank $rank failed after step $done_before; 3 ranks (went on from the|started again)" <<<"$e2e_out" ||
      e2e_fail "$precision stage $stage: no summary line of the failure"
  done
done

# Two failures, the second after the recovery: 4 -> 3 -> 2, no rejoin.
e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 3
e2e_json want param_hash hex
rm -rf "$work/ckpt"
e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 3 --save "$work/ckpt" --save-every 3 --elastic --fail 3:5 \
  --fail 0:10
e2e_json got param_hash hex
changes seen
e2e_same "$seen" "shrink 4->3 at 4 from 3 redone 1"$'\n'"shrink 3->2 at 9 from 9 redone 0" "4 -> 3 -> 2: the changes"
e2e_same "$got" "$want" "4 -> 3 -> 2: param_hash"

# A second failure during the recovery (before the smaller world's first step): a clear error, and the
# checkpoint of step 6 still loads and continues to the same bits.
rm -rf "$work/ckpt"
e2e_expect 1 "a second failure came during the recovery.*--fail 1:7" "$train_mlp" "${common[@]}" --ranks 4 --stage 2 \
  --save "$work/ckpt" --save-every 3 --elastic --fail 2:8 --fail 1:7
e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 2
e2e_json want param_hash hex
e2e_run "$train_mlp" --layers 3 --hidden 48 --batch 24 --micro-batch 2 --reproducible --steps 6 --json --ranks 3 \
  --stage 2 --resume "$work/ckpt"
e2e_json got param_hash hex
e2e_same "$got" "$want" "the checkpoint left by the failed recovery, resumed at N = 3 to step 12"

# In memory, a second failure during the recovery ends the run saying nothing is on disk.
e2e_expect 1 "a second failure came during the recovery.*nothing was saved to disk" "$train_mlp" "${common[@]}" \
  --ranks 4 --stage 2 --snapshot-every 3 --elastic --fail 2:8 --fail 1:7
# A rank lost with the rank holding its copy (rank 1 at step 5, then the new rank 1, which held old rank 1's copy,
# before the next snapshot): the memory cannot rebuild the snapshot of step 3. With --save the run goes on from
# the disk's checkpoint of step 3 to the same bits; without it, an error naming the missing file.
e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 3
e2e_json want param_hash hex
rm -rf "$work/ckpt"
e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 3 --save "$work/ckpt" --save-every 3 --snapshot-every 3 \
  --elastic --fail 1:5 --fail 1:5
e2e_json got param_hash hex
changes seen
sources from
e2e_same "$seen" "shrink 4->3 at 4 from 3 redone 1"$'\n'"shrink 3->2 at 4 from 3 redone 1" "two losses: the changes"
e2e_same "$from" "memory checkpoint" "two losses: memory first, then the disk"
e2e_same "$got" "$want" "two losses, memory then disk: param_hash"
e2e_expect 1 "memory cannot rebuild its peer snapshot.*no holder keeps the data file of rank 1 of its 4" \
  "$train_mlp" "${common[@]}" --ranks 4 --stage 3 --snapshot-every 3 --elastic --fail 1:5 --fail 1:5

# Growing: 2 -> 3 -> 4 ranks by new ranks at steps 4 and 7, and 3 -> 4 (a new rank at step 3), a failure
# at step 6 (-> 3), the lost rank back at step 9 (-> 4): the bits of the uninterrupted run.
e2e_run "$train_mlp" "${common[@]}" --ranks 3 --stage 3
e2e_json want param_hash hex
rm -rf "$work/ckpt"
e2e_run "$train_mlp" "${common[@]}" --ranks 2 --stage 3 --save "$work/ckpt" --save-every 3 --elastic --grow 4 --grow 7
e2e_json got param_hash hex
changes seen
e2e_same "$seen" "join 2->3 at 4 from 4 redone 0"$'\n'"join 3->4 at 7 from 7 redone 0" "2 -> 3 -> 4: the changes"
e2e_same "$got" "$want" "2 -> 3 -> 4 by --grow: param_hash"
grep -q "^elastic: grew to 4 ranks at the checkpoint of step 7" <<<"$e2e_out" || e2e_fail "no summary line of the growth"
e2e_run "$train_mlp" "${common[@]}" --ranks 2 --stage 3 --snapshot-every 3 --elastic --grow 4 --grow 7
e2e_json got param_hash hex
sources from
e2e_same "$from" "memory memory" "2 -> 3 -> 4 in memory: where the larger worlds went on from"
e2e_same "$got" "$want" "2 -> 3 -> 4 by --grow, in memory: param_hash"
grep -q "^elastic: grew to 4 ranks at the peer snapshot in memory of step 7" <<<"$e2e_out" ||
  e2e_fail "no summary line of the growth in memory"
grep -q "^elastic: [0-9]* peer snapshots (every 3 steps); rank 0 held" <<<"$e2e_out" ||
  e2e_fail "no summary line of the peer snapshots"
rm -rf "$work/ckpt"
e2e_run "$train_mlp" "${common[@]}" --ranks 3 --stage 1 --precision bf16 --save "$work/ckpt" --save-every 3 --elastic \
  --grow 3 --fail 1:6 --rejoin-step 9
e2e_json got param_hash hex
changes seen
e2e_same "$seen" "join 3->4 at 3 from 3 redone 0"$'\n'"shrink 4->3 at 5 from 3 redone 2"$'\n'"grow 3->4 at 9 from 9 redone 0" \
  "3 -> 4 -> 3 -> 4: the changes"
e2e_run "$train_mlp" "${common[@]}" --ranks 3 --stage 1 --precision bf16
e2e_json want param_hash hex
e2e_same "$got" "$want" "3 -> 4 -> 3 -> 4 (bf16, stage 1): param_hash"
# A world the batch does not split over after growing: an error naming it, the checkpoint kept.
rm -rf "$work/ckpt"
e2e_expect 1 "cannot go on at 5 ranks.*global batch 24" "$train_mlp" "${common[@]}" --ranks 4 --save "$work/ckpt" \
  --elastic --grow 5
[ -d "$work/ckpt/v-00000001" ] || e2e_fail "the checkpoint of step 5 is not kept"

# Without --elastic, a planted failure fails the run naming the rank.
e2e_expect 1 "planted failure \(--fail 1:3\): rank 1" "$train_mlp" "${common[@]}" --ranks 2 --fail 1:3
# A world that cannot hold the batch at N - 1 is an error naming it, not a hang.
rm -rf "$work/ckpt"
e2e_expect 1 "cannot go on at 3 ranks.*global batch 16" "$train_mlp" --layers 3 --hidden 48 --batch 16 \
  --micro-batch 2 --reproducible --steps 6 --ranks 4 --save "$work/ckpt" --save-every 2 --elastic --fail 0:4

# Refusals.
e2e_expect 2 "--elastic needs --save DIR or --snapshot-every K" "$train_mlp" "${common[@]}" --ranks 4 --elastic
e2e_expect 2 "--snapshot-every needs --elastic" "$train_mlp" "${common[@]}" --ranks 4 --snapshot-every 3
e2e_expect 2 "--elastic needs --ranks 2" "$train_mlp" "${common[@]}" --ranks 1 --elastic --save "$work/x"
e2e_expect 2 "the run has ranks 0-3" "$train_mlp" "${common[@]}" --ranks 4 --fail 4:3
e2e_expect 2 "the run trains steps 1-12" "$train_mlp" "${common[@]}" --ranks 4 --fail 1:13
e2e_expect 2 "expected RANK:STEP" "$train_mlp" "${common[@]}" --ranks 4 --fail 1-3
e2e_expect 2 "expected RANK:STEP" "$train_mlp" "${common[@]}" --ranks 4 --fail 1:0
e2e_expect 2 "--rejoin-step needs --elastic" "$train_mlp" "${common[@]}" --ranks 4 --rejoin-step 3
e2e_expect 2 "--grow needs --elastic" "$train_mlp" "${common[@]}" --ranks 4 --grow 3
e2e_expect 2 "the world grows between steps, and the run trains steps 1-12" "$train_mlp" "${common[@]}" --ranks 2 \
  --elastic --save "$work/x" --grow 12
e2e_expect 2 "--grow 3 is given twice" "$train_mlp" "${common[@]}" --ranks 2 --elastic --save "$work/x" --grow 3 --grow 3
e2e_expect 2 "at the same step" "$train_mlp" "${common[@]}" --ranks 2 --elastic --save "$work/x" --grow 3 \
  --rejoin-step 3
if "$train_mlp" --help | grep -q -- "--backend"; then
  e2e_expect 2 "run on --backend threads" "$train_mlp" "${common[@]}" --backend mpi --elastic --save "$work/x"
  e2e_expect 2 "run on --backend threads" "$train_mlp" "${common[@]}" --backend mpi --snapshot-every 2
fi
echo "train_mlp --elastic: every case passed"
