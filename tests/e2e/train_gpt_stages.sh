#!/usr/bin/env bash
# train_gpt end to end on a small model: for fp32 and bf16 at N = 2 and 4 (and with --accum and --clip),
# stages 0-3 print the same param_hash; model states equal the formula; the traffic equals the
# formula, which counts in stage 3 the two extra all-gathers of the tied unit (declared gathers(2))
# per micro-batch, recomputed here from the units the run reports; evaluation and sampling traffic is
# reported apart and equals the per-pass formula times the passes; under a memory limit the disk tier's
# slice is chosen to fit.
# Usage: train_gpt_stages.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
small=(--embd 32 --heads 2 --layers 1 --context 16 --steps 6 --eval-windows 8 --sample 0 --json)

check() {  # reads the JSON line, prints the hash, fails on an accounting mismatch
  python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
n, stage, m = j["ranks"], j["stage"], j["accum"]
elem = 4 if j["precision"] == "fp32" else 2
psi = j["padded_params"]
assert sum(u["padded"] for u in j["units"]) == psi, j["units"]
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
# The paper: 2M, M + 1, M + 1, 3M passes of Psi (N-1)/N elements.
passes = {0: 2 * m, 1: m + 1, 2: m + 1, 3: 3 * m}[stage]
assert j["comm_paper_formula_bytes"] == passes * psi // n * (n - 1) * elem, j
# The tied unit is declared gathered twice per pass: in stage 3 the formula adds two more
# all-gathers of it per micro-batch (forward and backward); gathers in stages 0-2 are views.
tied = [u for u in j["units"] if u["name"] == j["tied_unit"]][0]
assert tied["gathers"] == 2 and all(u["gathers"] == 1 for u in j["units"] if u is not tied), j["units"]
extra = 2 * m * tied["padded"] // n * (n - 1) * elem if stage == 3 else 0
assert j["comm_formula_bytes"] == j["comm_paper_formula_bytes"] + extra, (j, extra)
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
# One forward pass gathers every unit once and the tied one twice: stage 3 only.
per_pass = (psi + tied["padded"]) // n * (n - 1) * elem if stage == 3 else 0
assert j["eval_comm_formula_bytes_per_pass"] == per_pass, j
assert j["eval_passes"] > 0 and j["eval_comm_bytes_per_rank"] == per_pass * j["eval_passes"], j
print(j["param_hash"])'
}

runs=0
compare() {  # label, flags...: stages 0-3 must agree
  local label=$1; shift
  local h first
  for stage in 0 1 2 3; do
    e2e_run "$train_gpt" "${small[@]}" --stage $stage "$@"
    e2e_filter h hex check
    echo "$label stage $stage param_hash $h"
    [ "$stage" = 0 ] && first=$h
    e2e_same "$h" "$first" "$label: stage $stage against stage 0"
    runs=$((runs + 1))
  done
}

for precision in fp32 bf16; do
  compare "$precision N=2" --precision $precision --ranks 2 --batch 4
  compare "$precision N=4" --precision $precision --ranks 4 --batch 8
done
compare "fp16 N=3 accum 2 clip 0.5" --precision fp16 --ranks 3 --batch 6 --accum 2 --clip 0.5
compare "fp32 N=2 sgd accum 2" --optimizer sgd --ranks 2 --batch 8 --accum 2

# The stages agree because the run is deterministic, not because training did nothing: another
# seed gives another hash.
e2e_run "$train_gpt" "${small[@]}" --ranks 2 --batch 4
e2e_filter a hex check
e2e_run "$train_gpt" "${small[@]}" --ranks 2 --batch 4 --seed 2
e2e_filter b hex check
e2e_differ "$a" "$b" "seeds 1 and 2"
echo "$runs runs: stages bit-identical"

# --reproducible --micro-batch 2: 8 sequences per step, the same bits at N = 1 (stage 0) and N = 4
# (stage 3, the tied unit gathered twice per pass), with clipping; the traffic equals the formula.
repro() {  # repro VAR FLAGS...
  local var=$1
  shift
  e2e_run "$train_gpt" "${small[@]}" --batch 8 --micro-batch 2 --reproducible --clip 0.5 "$@"
  e2e_filter "$var" hex python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
assert j["reproducible"] and j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
print(j["param_hash"])'
}
repro a --ranks 1 --stage 0
repro b --ranks 4 --stage 3 --precision fp32
echo "reproducible: N=1 stage 0 $a, N=4 stage 3 $b"
e2e_same "$b" "$a" "--reproducible at N=4 stage 3 against N=1 stage 0"
# --offload disk under --memory-limit without --offload-slice: the largest slice whose plan fits (said
# on stderr), the same bits as without offload; the next larger slice, given by hand, is refused. The
# limit: what stays in memory (fp32 + AdamW: parameters and gradients, half the model states), the
# transient peak, and 60 KB for the tier's slices (less than its default slice stages here).
e2e_run "$train_gpt" "${small[@]}" --ranks 2 --batch 4 --stage 3
e2e_filter plain hex check
e2e_filter limit int python3 -c '
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(j["model_state_bytes_per_rank"] // 2 + j["transient_peak_bytes_per_rank"] + 60000)'
mkdir "$e2e_work/offload"
offload=(--offload disk --offload-dir "$e2e_work/offload" --memory-limit "$limit")
e2e_run "$train_gpt" "${small[@]}" --ranks 2 --batch 4 --stage 3 "${offload[@]}"
e2e_filter disk hex check
e2e_same "$disk" "$plain" "--offload disk under --memory-limit $limit against no offload"
slice=$(sed -En 's/^--offload disk: slices of ([0-9]+) elements, the largest that fits --memory-limit .*/\1/p' \
  <<<"$e2e_err")
e2e_value "the chosen slice" "$slice" int
e2e_expect 1 "out of memory" "$train_gpt" "${small[@]}" --ranks 2 --batch 4 --stage 3 "${offload[@]}" \
  --offload-slice $((slice + 1024))
echo "--offload disk under $limit bytes: slices of $slice elements chosen, param_hash $disk"
echo "1 passed, 0 failed"
