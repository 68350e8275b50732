#!/usr/bin/env bash
# tools/plot_run.py draws, headless, the --log files of short train_mlp runs (two stages on one
# figure) into a PNG; a log that is not a trainer's is refused with a message naming it.
# Usage: plot_run.sh TRAIN_MLP PLOT_RUN_PY
set -eu
train_mlp=$1 plot=$2
# The Debian package python3-matplotlib serves the system python, which another python3 on PATH may hide.
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with matplotlib (Debian: python3-matplotlib)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for stage in 0 3; do
  "$train_mlp" --stage $stage --ranks 2 --batch 16 --steps 5 --layers 3 --hidden 32 --log "$work/s$stage.jsonl" \
    >/dev/null 2>&1
done
MPLBACKEND=Agg "$py" "$plot" -o "$work/runs.png" "$work/s0.jsonl" "$work/s3.jsonl"
# A PNG: its signature, and a size that an empty canvas would not reach.
"$py" - "$work/runs.png" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
assert len(data) > 20000, f"only {len(data)} bytes"
print(f"PNG of {len(data)} bytes")
PY
echo '{"kind": "step", "step": 1}' >"$work/bad.jsonl"
if MPLBACKEND=Agg "$py" "$plot" -o "$work/bad.png" "$work/bad.jsonl" 2>"$work/err"; then
  echo "FAIL: a log without a run line was drawn"; exit 1
fi
grep -q "bad.jsonl: no 'run' line" "$work/err" || { echo "FAIL: message: $(cat "$work/err")"; exit 1; }
[ ! -e "$work/bad.png" ] || { echo "FAIL: an image was written for a bad log"; exit 1; }
echo "1 passed, 0 failed"
