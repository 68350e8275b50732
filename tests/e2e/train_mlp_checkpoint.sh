#!/usr/bin/env bash
# train_mlp checkpoints end to end: save at N=4 stage 3, resume at N=2 stage 1 without a loss jump,
# resume at N=4 stage 3 equal to an uninterrupted run, periodic saves (blocking and asynchronous), and a safetensors export that
# an independent reader accepts.
# Usage: train_mlp_checkpoint.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
work=$e2e_work
common=(--layers 3 --hidden 64 --json)
# train VAR FIELD KIND FLAGS...: VAR = FIELD of the run's JSON line.
train() {
  local var=$1 field=$2 kind=$3
  shift 3
  e2e_run "$train_mlp" "${common[@]}" "$@"
  e2e_json "$var" "$field" "$kind"
}
# close A B WHAT: |A - B| <= 1e-5 |B| (the summation order of the per-rank losses).
close() {
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(a - b) <= 1e-5 * max(abs(b), 1e-12) else 1)" "$1" "$2" || e2e_fail "$3: $1 against $2"
}

e2e_run "$train_mlp" "${common[@]}" --ranks 4 --stage 3 --steps 50 --save "$work/ck"
train straight param_hash hex --ranks 4 --stage 3 --steps 100
train resumed param_hash hex --ranks 4 --stage 3 --steps 50 --resume "$work/ck"
echo "uninterrupted 100 steps: $straight; 50 + resumed 50: $resumed"
e2e_same "$resumed" "$straight" "a resume at the same N and stage against the uninterrupted run"

# At another world size and stage the first loss after the resume is the uninterrupted run's loss at
# that step (same weights, same batch), up to the summation order of the per-rank losses.
train after loss_first number --ranks 2 --stage 1 --steps 50 --resume "$work/ck"
train at51 loss_last number --ranks 4 --stage 3 --steps 51
echo "loss at step 51: uninterrupted $at51, resumed at N=2 stage 1 $after"
close "$after" "$at51" "the loss after resharding"

# Lion (one slot): saved at N=4 stage 3 with its slot named, resumed at N=2 stage 1 without a loss jump.
e2e_run "$train_mlp" "${common[@]}" --optimizer lion --ranks 4 --stage 3 --steps 20 --save "$work/lion"
python3 - "$work/lion" <<'PY'
import glob, json, sys
m = json.load(open(sorted(glob.glob(sys.argv[1] + "/v-*/manifest.json"))[-1]))
assert m["optimizer"]["name"] == "lion", m["optimizer"]
assert m["slots"] == ["master", "m"], m["slots"]
assert sorted(m["optimizer"]["hyper_parameters"]) == ["beta1", "beta2", "lr", "weight_decay"], m["optimizer"]
print("lion checkpoint: slots", m["slots"], "settings", m["optimizer"]["hyper_parameters"])
PY
train after loss_first number --optimizer lion --ranks 2 --stage 1 --steps 5 --resume "$work/lion"
train at21 loss_last number --optimizer lion --ranks 4 --stage 3 --steps 21
echo "lion loss at step 21: uninterrupted $at21, resumed at N=2 stage 1 $after"
close "$after" "$at21" "lion's loss after resharding"

# --save-every: an interrupted run resumes from the last periodic save.
e2e_run "$train_mlp" "${common[@]}" --ranks 3 --batch 63 --stage 2 --steps 30 --save "$work/periodic" --save-every 10
train step first_step int --ranks 3 --batch 63 --stage 2 --steps 1 --resume "$work/periodic"
e2e_same "$step" 30 "the step of the last periodic save"

# --save-async: the same checkpoint files and the same end as blocking saves; each save is logged
# with its stall and write time; the checkpoint resumes at another N and stage.
train blocking param_hash hex --ranks 3 --batch 63 --stage 2 --steps 30 --save "$work/blocking" --save-every 10
train async param_hash hex --ranks 3 --batch 63 --stage 2 --steps 30 --save "$work/async" --save-every 10 \
  --save-async --log "$work/async.jsonl"
e2e_same "$async" "$blocking" "param_hash with asynchronous saves against blocking ones"
for f in "$work"/blocking/v-*/*; do
  cmp -s "$f" "$work/async/$(basename "$(dirname "$f")")/$(basename "$f")" ||
    e2e_fail "$(basename "$f") of the asynchronous save differs from the blocking save's"
done
python3 - "$work/async.jsonl" <<'PY'
import json, sys
saves = [j for j in map(json.loads, open(sys.argv[1])) if j["kind"] == "save"]
assert [s["step"] for s in saves] == [10, 20, 30], saves
assert [s["version"] for s in saves] == [1, 2, 3], saves
for s in saves:
    assert s["async"] is True and s["bytes"] > 0 and s["write_s"] > 0 and s["write_bytes_per_s"] > 0, s
    assert 0 <= s["waited_s"] <= s["stall_s"], s
print("asynchronous saves:", [(s["step"], round(s["stall_s"] * 1e3, 2), round(s["write_s"] * 1e3, 2)) for s in saves],
      "(step, ms held, ms writing)")
PY
train step first_step int --ranks 2 --batch 64 --stage 1 --steps 1 --resume "$work/async"
e2e_same "$step" 30 "the step of the last asynchronous save, resumed at N=2 stage 1"

# --export: a safetensors file with every tensor, checked by a reader written independently.
e2e_run "$train_mlp" "${common[@]}" --ranks 2 --stage 3 --steps 5 --precision bf16 --export "$work/model.safetensors"
python3 - "$work/model.safetensors" <<'PY'
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
names = [k for k in header if k != "__metadata__"]
assert names == ["layer0.w", "layer0.b", "layer1.w", "layer1.b", "layer2.w", "layer2.b"], names
end = 0
for k in names:
    t = header[k]
    assert t["dtype"] == "F32", t
    begin, stop = t["data_offsets"]
    count = 1
    for d in t["shape"]:
        count *= d
    assert begin == end and stop - begin == 4 * count, (k, t)
    end = stop
assert 8 + n + end == len(blob), "trailing or missing bytes"
print("export: %d tensors, %d bytes of data" % (len(names), end))
PY
echo "1 passed, 0 failed"
