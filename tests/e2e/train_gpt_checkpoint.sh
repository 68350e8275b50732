#!/usr/bin/env bash
# train_gpt checkpoints end to end: 10 steps, save, resume 10 more equals 20 uninterrupted steps
# (fp32 at N=4 stage 3, fp16 with its loss scale at N=2 stage 2); a resume at another N and stage
# continues at the uninterrupted run's loss; --steps 0 evaluates the saved model as the saving run
# did; the export holds every tensor under its unit's name.
# Usage: train_gpt_checkpoint.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
work=$e2e_work
# train VAR FIELD KIND FLAGS...: VAR = FIELD of the run's JSON line.
train() {
  local var=$1 field=$2 kind=$3
  shift 3
  e2e_run "$train_gpt" "${small[@]}" "$@"
  e2e_json "$var" "$field" "$kind"
}
small=(--embd 32 --heads 2 --layers 1 --context 16 --batch 8 --eval-windows 8 --sample 0 --json)

resume_equals() {  # label, flags...: 10 + resumed 10 steps against 20 uninterrupted ones
  local label=$1; shift
  local dir="$work/$label" straight resumed before again
  train before loss_held_out number "$@" --steps 10 --save "$dir"
  train straight param_hash hex "$@" --steps 20
  train resumed param_hash hex "$@" --steps 10 --resume "$dir"
  echo "$label: uninterrupted 20 steps $straight; 10 + resumed 10: $resumed"
  e2e_same "$resumed" "$straight" "$label: the resumed run against the uninterrupted one"
  # --steps 0: the loaded model evaluated again, as the saving run evaluated it at its end
  train again loss_held_out number "$@" --steps 0 --resume "$dir"
  echo "$label: held-out loss at the save $before, after loading $again"
  e2e_same "$again" "$before" "$label: the loaded model's held-out loss against the saving run's"
}
resume_equals fp32 --ranks 4 --stage 3
resume_equals fp16 --ranks 2 --stage 2 --precision fp16

# At another world size and stage, the first loss after the resume is the uninterrupted run's loss at
# step 11 (same weights, same batch), up to the order in which the per-rank losses are summed.
train after loss_first number --ranks 2 --stage 1 --steps 5 --resume "$work/fp32"
train at11 loss_last number --ranks 4 --stage 3 --steps 11
echo "loss at step 11: uninterrupted $at11, resumed at N=2 stage 1 $after"
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$after" "$at11" ||
  e2e_fail "the loss after resharding: $after against $at11"

# --export: every tensor, named unit.tensor, in declaration order, with its shape.
e2e_run "$train_gpt" "${small[@]}" --ranks 2 --stage 3 --steps 2 --precision bf16 --export "$work/gpt.safetensors"
printf '%s\n' "$e2e_out" >"$work/export.json"
python3 - "$work/gpt.safetensors" "$work/export.json" <<'PY'
import json, struct, sys
j = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
names = [k for k in header if k != "__metadata__"]
block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"]
assert names == ["wte.weight", "wpe.weight"] + ["h.0." + b for b in block] + ["ln_f.weight", "ln_f.bias"], names
V, C, T = j["model"]["vocab"], j["model"]["embd"], j["model"]["context"]
assert header["wte.weight"]["shape"] == [V, C] and header["wpe.weight"]["shape"] == [T, C], header
assert header["h.0.mlp.c_fc.weight"]["shape"] == [4 * C, C], header
total = sum(4 * eval("*".join(map(str, header[k]["shape"]))) for k in names)
assert 8 + n + total == len(blob) and total == 4 * j["params"], (total, j["params"])
print("export: %d tensors, %d parameters" % (len(names), j["params"]))
PY
echo "1 passed, 0 failed"
