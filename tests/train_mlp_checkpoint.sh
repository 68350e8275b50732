#!/usr/bin/env bash
# train_mlp checkpoints end to end: save at N=4 stage 3, resume at N=2 stage 1 without a loss jump,
# resume at N=4 stage 3 equal to an uninterrupted run, periodic saves, and a safetensors export that
# an independent reader accepts.
# Usage: train_mlp_checkpoint.sh TRAIN_MLP
set -eu
train_mlp=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
common=(--layers 3 --hidden 64 --json)

"$train_mlp" "${common[@]}" --ranks 4 --stage 3 --steps 50 --save "$work/ck" 2>/dev/null >/dev/null
straight=$("$train_mlp" "${common[@]}" --ranks 4 --stage 3 --steps 100 2>/dev/null | field param_hash)
resumed=$("$train_mlp" "${common[@]}" --ranks 4 --stage 3 --steps 50 --resume "$work/ck" 2>/dev/null | field param_hash)
echo "uninterrupted 100 steps: $straight; 50 + resumed 50: $resumed"
[ "$straight" = "$resumed" ] || { echo "FAIL: resume at the same N and stage differs"; exit 1; }

# At another world size and stage the first loss after the resume is the uninterrupted run's loss at
# that step (same weights, same batch), up to the summation order of the per-rank losses.
after=$("$train_mlp" "${common[@]}" --ranks 2 --stage 1 --steps 50 --resume "$work/ck" 2>/dev/null | field loss_first)
at51=$("$train_mlp" "${common[@]}" --ranks 4 --stage 3 --steps 51 2>/dev/null | field loss_last)
echo "loss at step 51: uninterrupted $at51, resumed at N=2 stage 1 $after"
python3 -c "import sys; a, b = $after, $at51; sys.exit(0 if abs(a - b) <= 1e-5 * max(abs(b), 1e-12) else 1)" ||
  { echo "FAIL: loss jump after resharding"; exit 1; }

# Lion (one slot): saved at N=4 stage 3 with its slot named, resumed at N=2 stage 1 without a loss jump.
"$train_mlp" "${common[@]}" --optimizer lion --ranks 4 --stage 3 --steps 20 --save "$work/lion" 2>/dev/null >/dev/null
python3 - "$work/lion" <<'PY'
import glob, json, sys
m = json.load(open(sorted(glob.glob(sys.argv[1] + "/v-*/manifest.json"))[-1]))
assert m["optimizer"]["name"] == "lion", m["optimizer"]
assert m["slots"] == ["master", "m"], m["slots"]
assert sorted(m["optimizer"]["hyper_parameters"]) == ["beta1", "beta2", "lr", "weight_decay"], m["optimizer"]
print("lion checkpoint: slots", m["slots"], "settings", m["optimizer"]["hyper_parameters"])
PY
after=$("$train_mlp" "${common[@]}" --optimizer lion --ranks 2 --stage 1 --steps 5 --resume "$work/lion" 2>/dev/null |
        field loss_first)
at21=$("$train_mlp" "${common[@]}" --optimizer lion --ranks 4 --stage 3 --steps 21 2>/dev/null | field loss_last)
echo "lion loss at step 21: uninterrupted $at21, resumed at N=2 stage 1 $after"
python3 -c "import sys; a, b = $after, $at21; sys.exit(0 if abs(a - b) <= 1e-5 * max(abs(b), 1e-12) else 1)" ||
  { echo "FAIL: lion loss jump after resharding"; exit 1; }

# --save-every: an interrupted run resumes from the last periodic save.
"$train_mlp" "${common[@]}" --ranks 3 --batch 63 --stage 2 --steps 30 --save "$work/periodic" --save-every 10 \
  2>/dev/null >/dev/null
step=$("$train_mlp" "${common[@]}" --ranks 3 --batch 63 --stage 2 --steps 1 --resume "$work/periodic" 2>/dev/null |
       field first_step)
[ "$step" = "30" ] || { echo "FAIL: the final save should be at step 30, got $step"; exit 1; }

# --export: a safetensors file with every tensor, checked by a reader written independently.
"$train_mlp" "${common[@]}" --ranks 2 --stage 3 --steps 5 --precision bf16 --export "$work/model.safetensors" \
  2>/dev/null >/dev/null
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
