#!/usr/bin/env bash
# train_mlp under bf16 and fp16: stages 0-3 print the same param_hash at each N, the K = 12 formulas
# hold, and the loss falls below half its first value; clipping and accumulation keep stages equal.
# Usage: train_mlp_precision.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
summary() {  # prints "hash loss_ok", fails on a formula mismatch
  python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
print(j["param_hash"], "halved" if j["loss_last"] < 0.5 * j["loss_first"] else "NOT-HALVED")'
}
same_for_all_stages() {  # same_for_all_stages LABEL ARGS...
  local label=$1; shift
  local out first
  for stage in 0 1 2 3; do
    e2e_run "$train_mlp" --json --stage "$stage" "$@"
    e2e_filter out any summary
    echo "$label stage $stage: $out"
    [[ $out =~ ^[0-9a-f]+\ halved$ ]] || e2e_fail "$label stage $stage did not halve the loss: $out"
    [ "$stage" = 0 ] && first=${out%% *}
    e2e_same "${out%% *}" "$first" "$label: stage $stage against stage 0"
  done
}
for precision in bf16 fp16; do
  for n in 1 2 4; do
    same_for_all_stages "$precision N=$n" --precision $precision --ranks $n --steps 60 --layers 3 --hidden 64
  done
done
same_for_all_stages "bf16 clip 0.5" --precision bf16 --clip 0.5 --ranks 4 --steps 60 --layers 3 --hidden 64
same_for_all_stages "fp32 accum 2" --accum 2 --ranks 4 --steps 60 --layers 3 --hidden 64
same_for_all_stages "fp16 accum 4" --precision fp16 --accum 4 --ranks 2 --steps 60 --layers 3 --hidden 64
e2e_run "$train_mlp" --json --precision fp16 --steps 5
python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
for k in ("overflow_steps", "loss_scale", "grad_norm"):
    assert k in j, k
print("fp16 JSON: overflow_steps", j["overflow_steps"], "loss_scale", j["loss_scale"], "grad_norm", j["grad_norm"])' \
  <<<"$e2e_out" || e2e_fail "fp16's JSON fields"
echo "1 passed, 0 failed"
