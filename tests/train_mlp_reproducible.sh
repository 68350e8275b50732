#!/usr/bin/env bash
# train_mlp --reproducible --micro-batch K: the same param_hash at N = 1, 2, 4, 8 (stages and precisions
# mixed), a checkpoint saved at one N and stage resumed at another equal to the uninterrupted run, the
# traffic and memory formulas, and the flags' refusals.
# Usage: train_mlp_reproducible.sh TRAIN_MLP
set -u
train_mlp=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
# 48 rows per step in micro-batches of 6: M = 8 / N; clipping on.
common=(--layers 3 --hidden 48 --batch 48 --micro-batch 6 --reproducible --clip 0.5 --json)

run() { "$train_mlp" "${common[@]}" "$@" 2>"$work/err"; }

for precision in fp32 bf16; do
  want=$(run --ranks 1 --stage 0 --precision $precision --steps 12 | field param_hash)
  for spec in "2 1" "4 2" "8 3" "4 3" "2 0"; do
    set -- $spec
    out=$(run --ranks $1 --stage $2 --precision $precision --steps 12)
    got=$(field param_hash <<<"$out")
    echo "$precision N=$1 stage $2: $got (N=1 stage 0: $want)"
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "$precision N=$1 stage $2: param_hash $got, N=1 gives $want"
    python3 - "$out" <<'PY' || fail "$precision N=$1 stage $2: formulas"
import json, sys
j = json.loads(sys.argv[1].strip().splitlines()[-1])
assert j["reproducible"] is True, j
assert j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"], j
assert j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"], j
assert j["accum"] == 48 // 6 // j["ranks"], j
PY
  done
done
# fp16: loss-scale decisions (skipped steps) the same at every N.
a=$(run --ranks 1 --stage 2 --precision fp16 --steps 12)
b=$(run --ranks 4 --stage 3 --precision fp16 --steps 12)
[ "$(field param_hash <<<"$a")" = "$(field param_hash <<<"$b")" ] || fail "fp16: N=1 and N=4 differ"
[ "$(field overflow_steps <<<"$a")" = "$(field overflow_steps <<<"$b")" ] || fail "fp16: overflow steps differ"
echo "fp16 N=1 and N=4: $(field param_hash <<<"$a"), $(field overflow_steps <<<"$a") overflow step(s)"

# The default mode is not the same at another N with the same micro-batches: the test above means something.
d1=$("$train_mlp" --layers 3 --hidden 48 --batch 48 --micro-batch 6 --json --ranks 1 --steps 12 2>/dev/null | field param_hash)
d4=$("$train_mlp" --layers 3 --hidden 48 --batch 48 --micro-batch 6 --json --ranks 4 --steps 12 2>/dev/null | field param_hash)
[ "$d1" != "$d4" ] || fail "the default mode gave the same hash at N=1 and N=4 ($d1): the check has no power"

# Saved after 6 steps at N=4 stage 3, resumed at N=2 stage 1 for 6 more: the uninterrupted run's bits.
run --ranks 4 --stage 3 --steps 6 --save "$work/ck" >/dev/null || fail "the save run exited with $?"
resumed=$(run --ranks 2 --stage 1 --steps 6 --resume "$work/ck" | field param_hash)
straight=$(run --ranks 8 --stage 2 --steps 12 | field param_hash)
echo "resumed at N=2 stage 1 after 6 steps at N=4 stage 3: $resumed; uninterrupted at N=8 stage 2: $straight"
[ -n "$straight" ] && [ "$resumed" = "$straight" ] || fail "the resume at another N differs"

# Refusals, exit code 2 with a message naming the flags.
refused() {
  local expect=$1
  shift
  "$train_mlp" "$@" >/dev/null 2>"$work/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit $rc, expected 2"
  grep -q -- "$expect" "$work/err" || fail "$*: no '$expect' in: $(head -c 300 "$work/err")"
}
refused "--reproducible requires --micro-batch" --reproducible --steps 1
refused "must be a multiple of --ranks 4 times --micro-batch 5" --batch 48 --micro-batch 5 --ranks 4 --steps 1
refused "--accum excludes --micro-batch" --micro-batch 4 --accum 2 --steps 1
refused "--reproducible keeps the bits at any world size" --reproducible --micro-batch 4 --qgz --ranks 2 --steps 1
refused "--reproducible keeps the bits at any world size" --reproducible --micro-batch 4 --qwz --ranks 2 --steps 1

# Master weights and moments on disk keep the bits.
offload=$(run --ranks 2 --stage 3 --steps 12 --offload disk --offload-dir "$work" | field param_hash)
echo "states on disk at N=2: $offload; uninterrupted at N=8: $straight"
[ "$offload" = "$straight" ] || fail "--offload disk changed the reproducible bits"

[ $status -eq 0 ] && echo ok
exit $status
