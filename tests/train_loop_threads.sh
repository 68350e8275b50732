#!/usr/bin/env bash
# examples/train_loop under threads: stages 0-3 (and N = 1, 2, 4) print the same param_hash; a run
# saved at N=4 stage 3 and resumed at N=2 stage 1 ends with the uninterrupted run's hash; the loop
# evaluates every K steps, its held-out loss falls, and a bad flag is a usage error.
# Usage: train_loop_threads.sh TRAIN_LOOP
set -eu
exe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hash_of() { sed -n 's/^final step [0-9]* param_hash \([0-9a-f]\{16\}\)$/\1/p'; }
fail() { echo "FAIL: $*"; exit 1; }

steps=(--steps 40 --eval-every 10)
want=$("$exe" --ranks 4 --stage 3 "${steps[@]}" | tee "$work/straight.txt" | hash_of)
[ -n "$want" ] || fail "no param_hash line in: $(cat "$work/straight.txt")"
echo "N=4 stage 3, 40 steps: $want"
for run in "4 0" "4 1" "4 2" "2 0" "2 3" "1 0"; do
  set -- $run
  got=$("$exe" --ranks "$1" --stage "$2" "${steps[@]}" | hash_of)
  echo "N=$1 stage $2: $got"
  [ "$got" = "$want" ] || fail "N=$1 stage $2 ends with param_hash '$got', N=4 stage 3 with '$want'"
done

# One eval line per 10 steps, and the held-out loss at the end is below its first value.
evals=$(grep -c '^step [0-9]* lr .* eval_loss ' "$work/straight.txt") || true
[ "$evals" -eq 4 ] || fail "expected 4 eval lines, got $evals: $(cat "$work/straight.txt")"
python3 - "$work/straight.txt" <<'PY' || fail "the held-out loss did not fall"
import re, sys
losses = [float(m.group(1)) for m in re.finditer(r"eval_loss ([0-9.]+)", open(sys.argv[1]).read())]
print("eval losses:", losses)
sys.exit(0 if losses[-1] < 0.5 * losses[0] else 1)
PY

# Save at N=4 stage 3 (periodically and at step 20), resume at N=2 stage 1 and run to step 40.
# The first part stops at step 20 of a run planned for 40: its schedule is the 40-step one.
"$exe" --ranks 4 --stage 3 --steps 20 --schedule-steps 40 --eval-every 0 --save "$work/ck" --save-every 7 >/dev/null
ls "$work/ck" | grep -q '^v-' || fail "no checkpoint version in $work/ck"
resumed=$("$exe" --ranks 2 --stage 1 "${steps[@]}" --resume "$work/ck" | tee "$work/resumed.txt" | hash_of)
echo "saved at N=4 stage 3 step 20, resumed at N=2 stage 1 to step 40: $resumed"
[ "$resumed" = "$want" ] || fail "the resumed run ends with '$resumed', the uninterrupted one with '$want'"
# The resumed run continues the schedule and the evaluations where the first left off.
first_eval=$(sed -n 's/^step \([0-9]*\) .*/\1/p' "$work/resumed.txt" | head -n1)
[ "$first_eval" = "30" ] || fail "the resumed run's first eval is at step '$first_eval', expected 30"
cmp <(grep '^step 40 ' "$work/straight.txt") <(grep '^step 40 ' "$work/resumed.txt") ||
  fail "step 40's eval line differs between the uninterrupted and the resumed run"

# Usage errors: exit 2, nothing trained.
set +e
"$exe" --ranks 3 >/dev/null 2>&1; rc=$?
[ $rc -ne 0 ] || fail "--ranks 3 (does not divide the batch 16 as a power of two) was accepted"
"$exe" --save-every 5 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "--save-every without --save: exit $rc, expected 2"
echo "ok"
