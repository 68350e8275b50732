#!/usr/bin/env bash
# examples/train_loop under threads: stages 0-3 (and N = 1, 2, 4) print the same param_hash; a run
# saved at N=4 stage 3 and resumed at N=2 stage 1 ends with the uninterrupted run's hash; the loop
# evaluates every K steps, its held-out loss falls, and a bad flag is a usage error.
# Usage: train_loop_threads.sh TRAIN_LOOP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
exe=$1
work=$e2e_work
final_hash='s/^final step [0-9]* param_hash \([0-9a-f]\{16\}\)$/\1/p'

steps=(--steps 40 --eval-every 10)
e2e_run "$exe" --ranks 4 --stage 3 "${steps[@]}"
printf '%s\n' "$e2e_out" >"$work/straight.txt"
e2e_sed want "$final_hash" hex
echo "N=4 stage 3, 40 steps: $want"
for run in "4 0" "4 1" "4 2" "2 0" "2 3" "1 0"; do
  set -- $run
  e2e_run "$exe" --ranks "$1" --stage "$2" "${steps[@]}"
  e2e_sed got "$final_hash" hex
  echo "N=$1 stage $2: $got"
  e2e_same "$got" "$want" "N=$1 stage $2 against N=4 stage 3"
done

# One eval line per 10 steps, and the held-out loss at the end is below its first value.
evals=$(grep -c '^step [0-9]* lr .* eval_loss ' "$work/straight.txt" || true)  # grep -c exits 1 on 0 lines
[ "$evals" -eq 4 ] || e2e_fail "expected 4 eval lines, got $evals: $(cat "$work/straight.txt")"
python3 - "$work/straight.txt" <<'PY' || e2e_fail "the held-out loss did not fall"
import re, sys
losses = [float(m.group(1)) for m in re.finditer(r"eval_loss ([0-9.]+)", open(sys.argv[1]).read())]
print("eval losses:", losses)
sys.exit(0 if losses[-1] < 0.5 * losses[0] else 1)
PY

# Save at N=4 stage 3 (periodically and at step 20), resume at N=2 stage 1 and run to step 40.
# The first part stops at step 20 of a run planned for 40: its schedule is the 40-step one.
e2e_run "$exe" --ranks 4 --stage 3 --steps 20 --schedule-steps 40 --eval-every 0 --save "$work/ck" --save-every 7
ls "$work/ck" | grep '^v-' >/dev/null || e2e_fail "no checkpoint version in $work/ck"
e2e_run "$exe" --ranks 2 --stage 1 "${steps[@]}" --resume "$work/ck"
printf '%s\n' "$e2e_out" >"$work/resumed.txt"
e2e_sed resumed "$final_hash" hex
echo "saved at N=4 stage 3 step 20, resumed at N=2 stage 1 to step 40: $resumed"
e2e_same "$resumed" "$want" "the resumed run against the uninterrupted one"
# The resumed run continues the schedule and the evaluations where the first left off.
first_eval=$(sed -n 's/^step \([0-9]*\) .*/\1/p' "$work/resumed.txt" | sed -n 1p)
[ "$first_eval" = "30" ] || e2e_fail "the resumed run's first eval is at step '$first_eval', expected 30"
line40=$(grep '^step 40 ' "$work/straight.txt") || e2e_fail "no eval line for step 40 in the uninterrupted run"
e2e_same "$(grep '^step 40 ' "$work/resumed.txt" || true)" "$line40" "step 40's eval line of the resumed run"

# The same with --save-async (the writing in the background): the same resumed end.
e2e_run "$exe" --ranks 4 --stage 3 --steps 20 --schedule-steps 40 --eval-every 0 --save "$work/ck-async" --save-every 7 \
  --save-async
grep -q '^save at step 14: training held' <<<"$e2e_out" || e2e_fail "no report of the asynchronous save at step 14"
e2e_run "$exe" --ranks 2 --stage 1 "${steps[@]}" --resume "$work/ck-async"
e2e_sed resumed_async "$final_hash" hex
e2e_same "$resumed_async" "$want" "the run resumed from asynchronous saves against the uninterrupted one"

# Usage errors: exit 2, nothing trained.
e2e_run_rc "$exe" --ranks 3
[ "$e2e_rc" -ne 0 ] || e2e_fail "--ranks 3 (does not divide the batch 16 as a power of two) was accepted"
e2e_expect 2 'save' "$exe" --save-every 5
echo "ok"
