#!/usr/bin/env bash
# Builds the checkpoint parsers' libFuzzer target with clang (ASan + UBSan) and fuzzes it for a bounded
# time from a corpus of real files; exits 77 (skipped) where clang cannot link -fsanitize=fuzzer.
# Usage: run.sh INCLUDE_DIR CLANGXX CHECKPOINT_FIXTURE SECONDS   (ZERO_FUZZ_SECONDS overrides SECONDS)
set -u
here=$(cd "$(dirname "$0")" && pwd)
include=$1 clang=$2 fixture=$3 seconds=${ZERO_FUZZ_SECONDS:-$4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$work/probe.cpp"
if ! "$clang" -fsanitize=fuzzer "$work/probe.cpp" -o "$work/probe" 2>/dev/null; then
  echo "skipped: $clang cannot link -fsanitize=fuzzer (Debian: clang and libclang-rt-dev)"
  exit 77
fi
"$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$include" "$here/fuzz_checkpoint.cpp" -o "$work/fuzz" || { echo "FAIL: the fuzz target does not build"; exit 1; }

# Seeds: a real manifest for both manifest modes, a real safetensors file for the header parser.
"$fixture" "$work/fixture" >/dev/null || { echo "FAIL: the fixture did not run"; exit 1; }
mkdir -p "$work/corpus"
manifest=$(ls "$work"/fixture/ckpt/v-*/manifest.json | head -1)
{ printf '\000'; cat "$manifest"; } > "$work/corpus/manifest"
{ printf '\001'; cat "$manifest"; } > "$work/corpus/manifest-unchecked"
{ printf '\002'; cat "$work/fixture/model.safetensors"; } > "$work/corpus/safetensors"
# Seeds at the parsers' limits: nesting far deeper than they accept, segments that all reuse the same
# bytes (the amplification), a repeated member; each a small step from a real file.
python3 - "$manifest" "$work/corpus" <<'PY' || { echo "FAIL: the seeds were not written"; exit 1; }
import re, struct, sys
text, out = open(sys.argv[1]).read(), sys.argv[2]
def put(name, mode, body):
    open("%s/%s" % (out, name), "wb").write(bytes([mode]) + (body if isinstance(body, bytes) else body.encode()))
put("deep", 1, '{"format": ' + "[" * 6000 + "]" * 6000 + ', "x": 1}')
put("deep-hyper", 1, text.replace('"hyper_parameters":{', '"hyper_parameters":{"x":' + "[" * 3000 + "]" * 3000 + ",", 1))
put("amplified", 1, re.sub(r'"offsets":\[\d+,\d+,\d+\]', '"offsets":[0,0,0]', text))
put("duplicate", 1, text.replace('"step":', '"step":1,"step":', 1))
header = ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":' + "[" * 4000 + "]" * 4000 + "}").encode()
put("deep-safetensors", 2, struct.pack("<Q", len(header)) + header + bytes(4))
PY

cd "$work" && ./fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
  -dict="$here/manifest.dict" -print_final_stats=1 corpus > fuzz.log 2>&1
status=$?
if [ "$status" -ne 0 ]; then
  tail -60 fuzz.log
  echo "FAIL: the fuzzer found a crash or an escaping exception (status $status)"
  exit 1
fi
grep -E '^(Done|stat::)' fuzz.log
echo "ok: fuzzed for $seconds s without a finding"
