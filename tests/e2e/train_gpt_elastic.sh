#!/usr/bin/env bash
# train_gpt --elastic: a rank failed at a random step, the data-parallel world goes on one replica smaller from
# its newest checkpoint (with --tp 2 the failed rank's whole tensor-parallel group leaves), on disk or a peer
# snapshot in the ranks' memory (--snapshot-every: with --tp 2 each file is also held 2 ranks on, in the next
# group), and grows back at --rejoin-step, to the param_hash of the run that never failed (--reproducible); a
# world grown by a new tensor-parallel group (--grow); the refusals.
# Usage: train_gpt_elastic.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
work=$e2e_work
# 12 sequences per step, one per micro-batch: 3 per data-parallel rank at 4, 4 at 3.
common=(--steps 10 --batch 12 --micro-batch 1 --reproducible --json --layers 1 --embd 32 --heads 2 --context 16)
seed=${ELASTIC_SEED:-$RANDOM}
echo "failure steps drawn with seed $seed (ELASTIC_SEED=$seed repeats them)"
RANDOM=$seed

for spec in "4 1 0 fp32 disk" "4 1 3 bf16 memory" "8 2 3 fp32 memory" "8 2 1 bf16 disk"; do
  set -- $spec
  ranks=$1 tp=$2 stage=$3 precision=$4 source=$5
  saving=(--save "$work/ckpt" --save-every 2)
  [ $source = memory ] && saving=(--snapshot-every 2)
  e2e_run "$train_gpt" "${common[@]}" --ranks $ranks --tp $tp --stage $stage --precision $precision
  e2e_json want param_hash hex
  fail_step=$((2 + RANDOM % 7))  # steps 2-8, before --rejoin-step 9
  rank=$((RANDOM % ranks))
  rm -rf "$work/ckpt"
  e2e_run "$train_gpt" "${common[@]}" --ranks $ranks --tp $tp --stage $stage --precision $precision \
    "${saving[@]}" --elastic --fail "$rank:$fail_step" --rejoin-step 9
  e2e_json got param_hash hex
  done_before=$((fail_step - 1))
  e2e_filter seen any python3 -c '
import json, sys
e = json.loads(sys.stdin.read().strip().splitlines()[-1])["elastic"]
print(" ".join("%s %d->%d at %d from %d (%s)" % (c["kind"], c["from"], c["to"], c["at_step"], c["resumed_at"],
                                                c["source"]) for c in e["changes"]))
'
  smaller=$((ranks - tp))
  resumed=$((done_before / 2 * 2))
  [ $source = memory ] && at=memory || at=checkpoint
  [ $resumed -eq 0 ] && first=start || first=$at
  expected="shrink $ranks->$smaller at $done_before from $resumed ($first) grow $smaller->$ranks at 9 from 9 ($at)"
  echo "N=$ranks tp $tp stage $stage $precision ($source): rank $rank failed at step $fail_step: $got (uninterrupted: $want)"
  e2e_same "$seen" "$expected" "N=$ranks tp $tp: the membership changes"
  e2e_same "$got" "$want" "N=$ranks tp $tp stage $stage $precision: param_hash against the uninterrupted run"
done

# --grow with --tp 2: a new group of 2 joins at step 5 (4 -> 6 ranks, 2 -> 3 replicas).
e2e_run "$train_gpt" "${common[@]}" --ranks 4 --tp 2 --stage 3
e2e_json want param_hash hex
rm -rf "$work/ckpt"
e2e_run "$train_gpt" "${common[@]}" --ranks 4 --tp 2 --stage 3 --save "$work/ckpt" --elastic --grow 5
e2e_json got param_hash hex
e2e_filter seen any python3 -c '
import json, sys
e = json.loads(sys.stdin.read().strip().splitlines()[-1])["elastic"]
print(" ".join("%s %d->%d at %d" % (c["kind"], c["from"], c["to"], c["at_step"]) for c in e["changes"]))
'
e2e_same "$seen" "join 4->6 at 5" "--tp 2 --grow 5: the change"
e2e_same "$got" "$want" "--tp 2: 4 -> 6 ranks by --grow: param_hash"

e2e_expect 2 "--elastic with --tp 2 needs --ranks 4" "$train_gpt" "${common[@]}" --ranks 2 --tp 2 --elastic \
  --save "$work/x"
e2e_expect 2 "--elastic needs --save DIR or --snapshot-every K" "$train_gpt" "${common[@]}" --ranks 4 --elastic
e2e_expect 1 "planted failure \(--fail 0:2\)" "$train_gpt" "${common[@]}" --ranks 2 --fail 0:2
echo "train_gpt --elastic: every case passed"
