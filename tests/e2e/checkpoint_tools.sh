#!/usr/bin/env bash
# zero_export and train_mlp on hostile checkpoints and outputs: every refusal is exit status 1 with a message
# (never a crash, an abort or a hang), and nothing is written or removed outside the tool's own names.
# Every command runs under `timeout`, so a regression that hangs fails here within seconds.
# Usage: checkpoint_tools.sh TRAIN_MLP ZERO_EXPORT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1 zero_export=$2
xxh64_dir=$(cd "$(dirname "$0")/../checkpoint" && pwd)  # xxh64.py, the checksum the Python readers use
work=$e2e_work
e2e_cleanup() { chmod -R u+rwx "$work" 2>/dev/null; }
E2E_TIMEOUT=30  # seconds for any one command: exit 124 means it hung

# expect CODE PATTERN CMD...: CMD (under the time limit) exits with CODE and its output matches PATTERN;
# its stderr is left in $work/err.
expect() {
  e2e_expect "$@"
  printf '%s\n' "$e2e_err" >"$work/err"
  echo "ok   $(basename "$3") ${*:4} -> exit $e2e_rc"
}

# A small checkpoint to damage: copies of its one version directory.
small=(--layers 2 --hidden 16 --in 32 --classes 4 --batch 8 --steps 2 --ranks 2)
e2e_run "$train_mlp" "${small[@]}" --save "$work/ck"
version=$(ls -d "$work"/ck/v-*)
copy() { mkdir -p "$work/$1" && cp -r "$version" "$work/$1/" && ls -d "$work/$1"/v-*; }

# edit MANIFEST MODE: rewrites the manifest (see the modes below) with a valid checksum.
edit() {
  python3 - "$xxh64_dir" "$1" "$2" <<'PY'
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
grep -qx precious "$work/victim" || e2e_fail "the export wrote through a planted symbolic link"
! ls "$work"/model.safetensors.tmp-* >/dev/null 2>&1 || e2e_fail "the export left a temporary file behind"

# 5. Amplification: segments that reuse bytes are refused by --verify (it used to say ok) and export.
v=$(copy amplified)
edit "$v/manifest.json" amplify
expect 1 'must not share bytes' "$zero_export" --verify "$work/amplified"
expect 1 'must not share bytes' "$zero_export" "$work/amplified" "$work/amplified.safetensors"
[ ! -e "$work/amplified.safetensors" ] || e2e_fail "an output was written from an amplified manifest"

# 5. Out of memory while exporting: a 16 MiB tensor under the smallest address-space limit (in
# steps of 4 MB) that --verify needs. Exit status 1 with a message, no abort, no file left behind.
e2e_run "$train_mlp" --layers 1 --in 4096 --classes 1024 --batch 2 --steps 1 --ranks 1 --save "$work/big"
limited=(bash -c 'ulimit -v "$1" && shift && exec "$@"' limited)
base_kb=""
for kb in $(seq 4000 4000 80000); do
  e2e_run_rc "${limited[@]}" "$kb" "$zero_export" --verify "$work/big"
  if [ "$e2e_rc" -eq 0 ]; then
    base_kb=$kb
    break
  fi
done
[ -n "$base_kb" ] || e2e_fail "zero_export --verify did not run under 80 MB of address space"
expect 1 'out of memory' "${limited[@]}" "$base_kb" "$zero_export" "$work/big" "$work/oom.safetensors"
! ls "$work"/oom.safetensors* >/dev/null 2>&1 || e2e_fail "a failed export left a file behind"

# 7. train_mlp --export never uses or removes a directory it did not create.
mkdir -p "$work/out.safetensors.checkpoint.tmp"
echo "someone else's" >"$work/out.safetensors.checkpoint.tmp/notes"
expect 0 '' "$train_mlp" "${small[@]}" --export "$work/out.safetensors"
[ -f "$work/out.safetensors.checkpoint.tmp/notes" ] ||
  e2e_fail "train_mlp --export removed a directory it did not create"
! ls -d "$work"/out.safetensors.checkpoint-* >/dev/null 2>&1 ||
  e2e_fail "train_mlp --export left its temporary checkpoint"
[ -s "$work/out.safetensors" ] || e2e_fail "train_mlp --export wrote no output"

# 9. A version number at the width readers accept: the next save is refused, not committed unseen.
mkdir -p "$work/wide" && cp -r "$version" "$work/wide/v-999999999999999999"
expect 1 '18 digits' "$train_mlp" "${small[@]}" --resume "$work/wide" --save "$work/wide"
[ "$(ls "$work/wide")" = "v-999999999999999999" ] || e2e_fail "a version was committed past the readers' width"

# 13. Names from a manifest reach the terminal escaped.
v=$(copy escape)
edit "$v/manifest.json" escape
expect 1 'BF16' "$zero_export" --verify "$work/escape"
if python3 -c "import sys; sys.exit(0 if b'\x1b' in open(sys.argv[1], 'rb').read() or b'\x07' in open(sys.argv[1], 'rb').read() else 1)" "$work/err"; then
  e2e_fail "a control character from the manifest reached stderr"
fi
grep -q 'x1B' "$work/err" || e2e_fail "the escaped name is not in the message"
echo "all passed"
