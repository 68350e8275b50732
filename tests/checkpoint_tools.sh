#!/usr/bin/env bash
# zero_export and train_mlp on hostile checkpoints and outputs: every refusal is exit status 1 with a message
# (never a crash, an abort or a hang), and nothing is written or removed outside the tool's own names.
# Every command runs under `timeout`, so a regression that hangs fails here within seconds.
# Usage: checkpoint_tools.sh TRAIN_MLP ZERO_EXPORT
set -u
train_mlp=$1 zero_export=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'chmod -R u+rwx "$work" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
limit=30  # seconds for any one command

# expect CODE PATTERN CMD...: CMD (under the time limit) exits with CODE and its stderr matches PATTERN.
expect() {
  local want=$1 pattern=$2 rc
  shift 2
  timeout -k 5 "$limit" "$@" >"$work/out" 2>"$work/err"
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -Eq -- "$pattern" "$work/err"; then
    echo "FAIL: $* -> exit $rc (want $want; 124 means it hung), stderr lacks /$pattern/:"
    head -c 600 "$work/err"
    echo
    failures=$((failures + 1))
  else
    echo "ok   $(basename "$1") ${*:2} -> exit $rc"
  fi
}
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# A small checkpoint to damage: copies of its one version directory.
small=(--layers 2 --hidden 16 --in 32 --classes 4 --batch 8 --steps 2 --ranks 2)
"$train_mlp" "${small[@]}" --save "$work/ck" >/dev/null 2>&1 || { echo "FAIL: the fixture run failed"; exit 1; }
version=$(ls -d "$work"/ck/v-*)
copy() { mkdir -p "$work/$1" && cp -r "$version" "$work/$1/" && ls -d "$work/$1"/v-*; }

# edit MANIFEST MODE: rewrites the manifest (see the modes below) with a valid checksum.
edit() {
  python3 - "$here" "$1" "$2" <<'PY'
import re, sys
sys.path.insert(0, sys.argv[1])
from xxh64 import xxh64
path, mode = sys.argv[2], sys.argv[3]
text = open(path, "rb").read().decode()
deep = "[" * 1000000 + "]" * 1000000
if mode == "deep-hyper":     # a million levels inside the hyper-parameters
    text = text.replace('"hyper_parameters":{', '"hyper_parameters":{"x":' + deep + ",", 1)
elif mode == "amplify":      # layer0.b: 4096 segments that all read the same bytes of one file
    m = re.search(r'\{"name":"b","shape":\[(\d+)\],"dtype":"F32","segments":\[.*?\]\}\]\}', text)
    n = int(m.group(1))
    segs = ",".join('{"begin":%d,"end":%d,"file":0,"offsets":[0,0,0]}' % (k * n, (k + 1) * n) for k in range(4096))
    text = text.replace(m.group(0), '{"name":"b","shape":[%d],"dtype":"F32","segments":[%s]}' % (4096 * n, segs), 1)
elif mode == "escape":       # a tensor name with terminal control sequences, and a dtype that gets it quoted
    text = re.sub(r'\{"name":"b","shape":(\[\d+\]),"dtype":"F32"',
                  lambda m: '{"name":"b\\u001b]0;pwned\\u0007\\u001b[2J","shape":%s,"dtype":"BF16"' % m.group(1),
                  text, count=1)
else:
    sys.exit("unknown mode " + mode)
found = list(re.finditer(r'"manifest_xxh64"[ \t\r\n]*:[ \t\r\n]*"([0-9a-f]{16})"', text))
start, end = found[0].span(1)
text = text[:start] + "%016x" % xxh64((text[:start] + "0" * 16 + text[end:]).encode()) + text[end:]
open(path, "wb").write(text.encode())
PY
}

# 1. A million-deep manifest: refused (exit 1), not a segmentation fault.
v=$(copy deep)
python3 -c "import sys; open(sys.argv[1], 'w').write('{\"format\": ' + '[' * 1000000 + ']' * 1000000 + ', \"x\": 1}')" \
  "$v/manifest.json"
expect 1 'nested deeper than 32' "$zero_export" --verify "$work/deep"
expect 1 'nested deeper than 32' "$zero_export" "$work/deep" "$work/deep.safetensors"
expect 1 'nested deeper than 32' "$train_mlp" "${small[@]}" --resume "$work/deep"
v=$(copy deep-hyper)
edit "$v/manifest.json" deep-hyper
expect 1 'nested deeper than 32' "$zero_export" --verify "$work/deep-hyper"

# 3. A FIFO as the manifest or as a data file: refused at once, not waited on.
v=$(copy fifo-manifest)
rm "$v/manifest.json" && mkfifo "$v/manifest.json"
expect 1 'FIFO' "$zero_export" --verify "$work/fifo-manifest"
expect 1 'FIFO' "$zero_export" --verify "$v"
expect 1 'FIFO' "$train_mlp" "${small[@]}" --resume "$work/fifo-manifest"
v=$(copy fifo-data)
rm "$v/rank-00001-of-00002.bin" && mkfifo "$v/rank-00001-of-00002.bin"
expect 1 'FIFO' "$zero_export" "$work/fifo-data" "$work/fifo.safetensors"
expect 1 'FIFO' "$train_mlp" "${small[@]}" --resume "$work/fifo-data"

# 4. A symbolic link planted at the temporary name the export used to write: never written through.
echo "precious" >"$work/victim"
ln -s "$work/victim" "$work/model.safetensors.tmp"
expect 0 '' "$zero_export" "$work/ck" "$work/model.safetensors"
grep -qx precious "$work/victim" || fail "the export wrote through a planted symbolic link"
ls "$work"/model.safetensors.tmp-* >/dev/null 2>&1 && fail "the export left a temporary file behind"

# 5. Amplification: segments that reuse bytes are refused by --verify (it used to say ok) and export.
v=$(copy amplified)
edit "$v/manifest.json" amplify
expect 1 'must not share bytes' "$zero_export" --verify "$work/amplified"
expect 1 'must not share bytes' "$zero_export" "$work/amplified" "$work/amplified.safetensors"
[ -e "$work/amplified.safetensors" ] && fail "an output was written from an amplified manifest"

# 5. Out of memory while exporting: a 16 MiB tensor under the smallest address-space limit (in
# steps of 4 MB) that --verify needs. Exit status 1 with a message, no abort, no file left behind.
"$train_mlp" --layers 1 --in 4096 --classes 1024 --batch 2 --steps 1 --ranks 1 --save "$work/big" >/dev/null 2>&1 ||
  fail "the large fixture run failed"
limited() { ulimit -v "$1" && shift && exec "$@"; }
base_kb=""
for kb in $(seq 4000 4000 80000); do
  if (limited "$kb" "$zero_export" --verify "$work/big") >/dev/null 2>&1; then
    base_kb=$kb
    break
  fi
done
if [ -n "$base_kb" ]; then
  expect 1 'out of memory' bash -c 'ulimit -v "$1" && shift && exec "$@"' limited "$base_kb" \
    "$zero_export" "$work/big" "$work/oom.safetensors"
  ls "$work"/oom.safetensors* >/dev/null 2>&1 && fail "a failed export left a file behind"
else
  fail "zero_export --verify did not run under 80 MB of address space"
fi

# 7. train_mlp --export never uses or removes a directory it did not create.
mkdir -p "$work/out.safetensors.checkpoint.tmp"
echo "someone else's" >"$work/out.safetensors.checkpoint.tmp/notes"
expect 0 '' "$train_mlp" "${small[@]}" --export "$work/out.safetensors"
[ -f "$work/out.safetensors.checkpoint.tmp/notes" ] || fail "train_mlp --export removed a directory it did not create"
ls -d "$work"/out.safetensors.checkpoint-* >/dev/null 2>&1 && fail "train_mlp --export left its temporary checkpoint"
[ -s "$work/out.safetensors" ] || fail "train_mlp --export wrote no output"

# 9. A version number at the width readers accept: the next save is refused, not committed unseen.
mkdir -p "$work/wide" && cp -r "$version" "$work/wide/v-999999999999999999"
expect 1 '18 digits' "$train_mlp" "${small[@]}" --resume "$work/wide" --save "$work/wide"
[ "$(ls "$work/wide")" = "v-999999999999999999" ] || fail "a version was committed past the readers' width"

# 13. Names from a manifest reach the terminal escaped.
v=$(copy escape)
edit "$v/manifest.json" escape
expect 1 'BF16' "$zero_export" --verify "$work/escape"
if python3 -c "import sys; sys.exit(0 if b'\x1b' in open(sys.argv[1], 'rb').read() or b'\x07' in open(sys.argv[1], 'rb').read() else 1)" "$work/err"; then
  fail "a control character from the manifest reached stderr"
fi
grep -q 'x1B' "$work/err" || fail "the escaped name is not in the message"

if [ "$failures" -ne 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "all passed"
