#!/usr/bin/env bash
# tools/plot_run.py draws, headless, the --log files of short train_mlp runs (two stages on one
# figure) into a PNG; a log that is not a trainer's is refused with a message naming it; a python3
# without matplotlib gets one line naming the package, not a traceback.
# Usage: plot_run.sh TRAIN_MLP PLOT_RUN_PY
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1 plot=$2
# A python3 without matplotlib (one that cannot import it, here): one line naming the package and the
# way to install it, no traceback.
mkdir "$e2e_work/no-mpl" "$e2e_work/no-mpl/matplotlib"
echo 'raise ImportError("matplotlib hidden by plot_run.sh")' >"$e2e_work/no-mpl/matplotlib/__init__.py"
e2e_run_rc env PYTHONPATH="$e2e_work/no-mpl" python3 "$plot" -o "$e2e_work/none.png" "$e2e_work/none.jsonl"
[ "$e2e_rc" -ne 0 ] || e2e_fail "plot_run.py without matplotlib exited 0"
[ "$(grep -c . <<<"$e2e_err")" -eq 1 ] && grep -q "no matplotlib: install python3-matplotlib (scripts/setup.sh" \
  <<<"$e2e_err" || e2e_fail "without matplotlib, expected one line naming the package: $e2e_err"
echo "without matplotlib: $e2e_err"
# The Debian package python3-matplotlib serves the system python, which another python3 on PATH may hide.
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with matplotlib (Debian: python3-matplotlib)"; exit 77; }
work=$e2e_work
for stage in 0 3; do
  e2e_run "$train_mlp" --stage $stage --ranks 2 --batch 16 --steps 5 --layers 3 --hidden 32 --log "$work/s$stage.jsonl"
done
e2e_run env MPLBACKEND=Agg "$py" "$plot" -o "$work/runs.png" "$work/s0.jsonl" "$work/s3.jsonl"
# A PNG: its signature, and a size that an empty canvas would not reach.
"$py" - "$work/runs.png" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
assert len(data) > 20000, f"only {len(data)} bytes"
print(f"PNG of {len(data)} bytes")
PY
echo '{"kind": "step", "step": 1}' >"$work/bad.jsonl"
e2e_run_rc env MPLBACKEND=Agg "$py" "$plot" -o "$work/bad.png" "$work/bad.jsonl"
[ "$e2e_rc" -ne 0 ] || e2e_fail "a log without a run line was drawn"
grep -q "bad.jsonl: no 'run' line" <<<"$e2e_err" || e2e_fail "message: $e2e_err"
[ ! -e "$work/bad.png" ] || e2e_fail "an image was written for a bad log"
echo "1 passed, 0 failed"
