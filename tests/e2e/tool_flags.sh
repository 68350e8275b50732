#!/usr/bin/env bash
# Every tool refuses the same hostile values (numbers that wrap, nan, empty, control characters, a FIFO, /proc) with exit 2 and an escaped message, before any work.
# Usage: tool_flags.sh TRAIN_MLP TRAIN_GPT TRAIN_LOOP ZERO_PLAN ZERO_EXPORT [TRAIN_MLP_CUDA]
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1 train_gpt=$2 train_loop=$3 zero_plan=$4 zero_export=$5 train_mlp_cuda=${6:-}
checks=0
tmp=$e2e_work
esc=$'\e[31mred'  # a terminal's escape sequence: it must reach the terminal as \x1B, never raw
mkfifo "$tmp/fifo"
mkdir "$tmp/dir"
printf 'hello world, a short text corpus.\n%.0s' {1..100} >"$tmp/text.txt"
# Within 20 s: a FIFO opened for reading would block for ever.
E2E_TIMEOUT=20

# refused [--] PATTERN TOOL ARGS...: exit 2, the output matches PATTERN, holds no raw ESC byte, and
# shows an escaped one where the input had it.
refused() {
  [ "$1" = -- ] && shift  # lets a pattern start with a dash
  local pattern=$1 tool=$2
  shift 2
  checks=$((checks + 1))
  e2e_run_rc "$tool" "$@" </dev/null
  local out=$e2e_out$'\n'$e2e_err rc=$e2e_rc why=""
  [ $rc -eq 2 ] || why="exit $rc, want 2"
  [ -z "$why" ] && ! grep -Eq -- "$pattern" <<<"$out" && why="no /$pattern/ in the message"
  [ -z "$why" ] && [[ "$out" == *$'\e'* ]] && why="a raw ESC byte in the output"
  [ -z "$why" ] && [[ "$*" == *$'\e'* ]] && [[ "$out" != *'\x1B'* ]] && why="the ESC is not shown escaped"
  [ -z "$why" ] || e2e_fail "$(basename "$tool") $(printf '%q ' "$@"): $why: $(head -3 <<<"$out" | cat -v)"
}

# The same hostile values for every numeric flag of every tool: negative (or a wrap to 2^64 - 1),
# 2^64, 2^65, nan, inf, empty, and text with a control sequence.
hostile=(-1 18446744073709551616 36893488147419103232 nan inf -inf '' "1$esc" 1e999)
numbers() {  # numbers TOOL "FIXED ARGS" FLAG...
  local tool=$1 fixed=$2
  shift 2
  for flag in "$@"; do
    for v in "${hostile[@]}"; do
      # shellcheck disable=SC2086
      refused -- "${flag#--}" "$tool" $fixed "$flag" "$v"
    done
  done
}
numbers "$train_mlp" "" --steps --ranks --stage --lr --clip --seed --batch --layers --hidden --in --classes --accum \
  --micro-batch --memory-limit --comm-timeout --link-gbps --link-latency-us --hpz --node-size --shard-group \
  --host-threads
numbers "$train_mlp" "--offload host" --offload-slice
numbers "$train_mlp" "--save $tmp/s" --save-every
numbers "$train_mlp" "--elastic --save $tmp/s" --snapshot-every
numbers "$train_mlp" "--qgz" --quant-block --qwz-bits --qgz-bits
numbers "$train_gpt" "" --steps --ranks --lr --seed --batch --layers --embd --heads --context --tp --held-out \
  --eval-windows --sample --temperature --beta2 --data-limit --comm-timeout
numbers "$train_loop" "" --steps --ranks --stage --seed --eval-every --schedule-steps
numbers "$train_loop" "--save $tmp/l" --save-every
numbers "$zero_plan" "" --memory --clip --accum --ranks --stage --layers --hidden --in --classes --tp
numbers "$zero_plan" "--stage 3 --ranks 4" --hpz --node-size --shard-group
numbers "$zero_plan" "--stage 3 --qwz --qgz" --quant-block --qwz-bits --qgz-bits
numbers "$zero_plan" "" --activations
if [ -n "$train_mlp_cuda" ]; then
  numbers "$train_mlp_cuda" "" --steps --ranks --lr --clip --seed --batch --memory-limit --offload-slice
fi

# Names: a value that is no member of its list is shown escaped.
refused 'optimizer' "$train_mlp" --optimizer "$esc"
refused 'precision' "$train_gpt" --precision "$esc"
refused 'backend' "$train_loop" --backend "$esc"
refused 'optimizer' "$zero_plan" --optimizer "$esc"
refused 'host-isa' "$train_mlp" --host-isa "$esc"
refused 'host-isa' "$train_mlp" --host-isa avx1024

# Files read: a FIFO (it would block), an empty path, a /proc path that is not there, a name with a
# control sequence; none is opened for long, all are usage errors.
for bad in "$tmp/fifo" "" /proc/zero-x "$tmp/$esc"; do
  refused 'resume' "$train_mlp" --resume "$bad"
  refused 'resume' "$train_loop" --resume "$bad"
  refused 'data' "$train_gpt" --data "$bad"
  refused 'model' "$zero_plan" --model "$bad"
  refused 'checkpoint' "$zero_export" "$bad" "$tmp/out.safetensors"
  refused 'checkpoint' "$zero_export" --verify "$bad"
done
# Files written: nothing can be created in /proc (root passes access(2) there: the tools create the
# directory, or a probe file, to know), an empty path, a FIFO, a name with a control sequence.
for bad in /proc/zero-x /proc/zero-x/sub "" "$tmp/fifo" "/proc/$esc"; do
  refused 'save' "$train_mlp" --save "$bad"
  refused 'export' "$train_mlp" --export "$bad"
  refused 'log' "$train_mlp" --log "$bad"
  refused 'save' "$train_gpt" --save "$bad"
  refused 'save' "$train_loop" --save "$bad"
  refused 'output' "$zero_export" "$tmp/dir" "$bad"
done
[ ! -e /proc/zero-x ] || e2e_fail "/proc/zero-x was created"
refused 'offload-dir' "$train_mlp" --offload disk --offload-dir /proc/self
refused 'offload-dir' "$train_mlp" --offload disk --offload-dir "$tmp/fifo"

# Flags that would do nothing in the chosen mode, and misuse that used to fail only in the library.
refused -- '--offload-dir.*--offload host' "$train_mlp" --offload host --offload-dir "$tmp/dir"
refused -- '--offload-dir.*--offload none' "$train_mlp" --offload-dir "$tmp/dir"
refused -- '--offload disk needs --offload-dir' "$train_mlp" --offload disk
refused -- '--offload-slice.*multiple of 1024' "$train_mlp" --offload host --offload-slice 1025
refused -- '--offload-slice.*--offload none' "$train_mlp" --offload-slice 2048
refused -- '--qwz-bits.*needs --qwz' "$train_mlp" --qwz-bits 4
refused -- '--qgz-bits.*needs --qgz' "$train_mlp" --qgz-bits 4 --stage 2
refused -- '--qgz-error-feedback.*needs --qgz' "$train_mlp" --qgz-error-feedback --stage 2
refused -- '--quant-block.*needs --qwz or --qgz' "$train_mlp" --quant-block 64
refused -- '--qwz-bits.*not 8 or 4' "$train_mlp" --qwz-bits 6
refused -- '--log-overwrite' "$train_mlp" --log-overwrite
refused -- '--qwz.*gathers no parameters' "$train_gpt" --qwz --stage 2
refused -- '--node-size 3 does not divide' "$train_gpt" --node-size 3 --ranks 4
refused -- '--warmup 50 is longer than the run' "$train_gpt" --warmup 50 --steps 20
refused -- '--temperature.*--sample 0' "$train_gpt" --sample 0 --temperature 0.5
refused -- '--prompt.*--sample 0' "$train_gpt" --sample 0 --prompt 'The'
refused -- '--steps 4.*warms up over its first 5 steps' "$train_loop" --steps 4
refused -- '--schedule-steps 3.*warms up' "$train_loop" --steps 3 --schedule-steps 3
refused -- '--schedule-steps 10 ends before --steps 20' "$train_loop" --steps 20 --schedule-steps 10
refused -- 'save-every.*--save' "$train_loop" --save-every 5
refused -- 'save-async.*--save' "$train_loop" --save-async
refused -- 'save-async.*--save' "$train_mlp" --save-async
refused -- 'save-async.*--save' "$train_gpt" --save-async
refused -- '--verify.*output|output.*--verify' "$zero_export" --verify "$tmp/dir" "$tmp/out.safetensors"
refused -- '--force.*output|output.*--force' "$zero_export" --force --verify "$tmp/dir"
refused -- 'OUTPUT is required' "$zero_export" "$tmp/dir"
refused -- 'not a byte count' "$zero_plan" --memory 5XB
refused -- 'more than 2\^64 - 1 bytes' "$zero_plan" --memory 17000000PiB
refused -- 'Usage|unrecognized|Extras|not expected' "$zero_plan" --no-such-flag
# zero_plan refuses the ZeRO++ combinations the trainers refuse, with their words.
refused -- '--qwz.*--stage 2 gathers no parameters' "$zero_plan" --qwz --stage 2
refused -- '--qgz.*--stage 0 all-reduces' "$zero_plan" --qgz
refused -- '--node-size 3 does not divide the 4 ranks' "$zero_plan" --node-size 3 --ranks 4
refused -- '--hpz 4: nodes of all 4 ranks' "$zero_plan" --hpz 4 --ranks 4 --stage 3
refused -- '--hpz 2 and --node-size 4 disagree' "$zero_plan" --hpz 2 --node-size 4 --ranks 8 --stage 3
refused -- '--qgz-error-feedback.*needs --qgz' "$zero_plan" --qgz-error-feedback --stage 1
refused -- '--qwz-bits.*needs --qwz' "$zero_plan" --qwz-bits 4 --stage 3
refused -- '--reproducible.*drop one of them' "$zero_plan" --reproducible --qgz --stage 1
refused -- 'overlap' "$zero_plan" --overlap "$esc"
# --activations: three values, bytes of 2 or 4, no model flags beside it.
refused -- '--activations takes L,E,B' "$zero_plan" --activations 2,10
refused -- '--activations takes L,E,B' "$zero_plan" --activations 2,10,3
refused -- 'takes only --tp and --json, not --stage' "$zero_plan" --activations 2,10,4 --stage 1

# The corpus of the character model: empty, binary, a FIFO inside a directory's reach, and a 100 GB
# sparse file (refused from its size at once, not read until memory runs out).
: >"$tmp/empty.txt"
printf 'text\0more' >"$tmp/binary.txt"
truncate -s 100G "$tmp/huge.txt"
refused -- "--data: corpus: '$tmp/empty.txt' is empty" "$train_gpt" --data "$tmp/empty.txt"
refused -- "is binary, not text: it has a NUL byte at offset 4" "$train_gpt" --data "$tmp/binary.txt"
start=$SECONDS
refused -- "huge.txt' has 107374182400 bytes, more than the [0-9]+ bytes the corpus may hold \(--data-limit\)" \
  "$train_gpt" --data "$tmp/huge.txt"
[ $((SECONDS - start)) -le 5 ] || e2e_fail "the 100 GB corpus took $((SECONDS - start)) s to refuse"
refused -- "more than the 3399 bytes the corpus may hold" "$train_gpt" --data "$tmp/text.txt" --data-limit 3399
refused -- "left of what the corpus may hold \(--data-limit 4000, 3400 read before it\)" \
  "$train_gpt" --data "$tmp/text.txt" --data "$tmp/text.txt" --data-limit 4000

# A model file whose names hold a control sequence: its error (exit 1: the file's content, not the
# command line) shows every name escaped.
printf '[{"name": "\\u001b[31mfc", "tensors": [{"name": "w\\u001b[0m", "shape": [0]}]}]' >"$tmp/model.json"
e2e_run_rc "$zero_plan" --model "$tmp/model.json"
checks=$((checks + 1))
out=$e2e_out$'\n'$e2e_err
if [ "$e2e_rc" -ne 1 ] || [[ "$out" == *$'\e'* ]] || [[ "$out" != *"unit '\x1B[31mfc' tensor 'w\x1B[0m'"* ]]; then
  e2e_fail "zero_plan --model with control sequences in its names: exit $e2e_rc: $(cat -v <<<"$out")"
fi

# zero_plan --tp: one rank of a dp x tp mesh plans the pieces of the tensors a --model splits, the
# same bytes as a model of those pieces written out, with the norm of every step a mesh computes
# (two sums and the fingerprint: 80 bytes); refusals name what is wrong.
printf '[{"name": "fc", "tensors": [{"name": "w", "shape": [64, 96], "tp_split": 1}, {"name": "b", "shape": [96], "tp_split": 0}, {"name": "g", "shape": [64]}]}]' >"$tmp/tp.json"
printf '[{"name": "fc", "tensors": [{"name": "w", "shape": [64, 48]}, {"name": "b", "shape": [48]}, {"name": "g", "shape": [64]}]}]' >"$tmp/pieces.json"
field() { python3 -c "import json, sys; print(json.loads(sys.argv[1])['plans'][0][sys.argv[2]])" "$1" "$2"; }
e2e_run "$zero_plan" --model "$tmp/tp.json" --tp 2 --ranks 2 --stage 1 --json
mesh=$e2e_out
e2e_run "$zero_plan" --model "$tmp/pieces.json" --ranks 2 --stage 1 --json
plain=$e2e_out
checks=$((checks + 1))
for f in params_bytes grads_bytes master_bytes optimizer_states_bytes; do
  [ "$(field "$mesh" $f)" = "$(field "$plain" $f)" ] || e2e_fail "zero_plan --tp 2: $f differs from the pieces' model"
done
[ "$(field "$mesh" norm_bytes)" = 80 ] && [ "$(field "$plain" norm_bytes)" = 0 ] ||
  e2e_fail "zero_plan --tp 2: norm_bytes $(field "$mesh" norm_bytes) (want 80; the plain model's: $(field "$plain" norm_bytes))"
refused -- '--tp 2 plans the pieces of split tensors, but no tensor of the model declares' "$zero_plan" --tp 2
e2e_expect 1 "tensor 'w': dimension 1 \\(96\\) cannot be cut into 5" "$zero_plan" --model "$tmp/tp.json" --tp 5
checks=$((checks + 1))
printf '[{"name": "fc", "tensors": [{"name": "w", "shape": [4, 4], "tp_split": 2}]}]' >"$tmp/tp_bad.json"
e2e_expect 1 '"tp_split" 2 is not a dimension of its shape' "$zero_plan" --model "$tmp/tp_bad.json" --tp 2
checks=$((checks + 1))

# A corpus may hold any byte but NUL: a control sequence in it trains, and what train_gpt prints of
# the corpus (the sample) shows it escaped.
printf 'a text with a \e[31m colour in it, and more words after that. %.0s' {1..60} >"$tmp/colour.txt"
e2e_run "$train_gpt" --data "$tmp/colour.txt" --steps 1 --ranks 1 --layers 1 --embd 8 --heads 1 --context 8 --batch 2 \
  --eval-windows 1 --sample 64 --temperature 0 --prompt 'a text'
checks=$((checks + 1))
out=$e2e_out$'\n'$e2e_err
if [[ "$out" == *$'\e'* ]] || [[ "$out" != *"vocabulary"* ]]; then
  e2e_fail "train_gpt on a corpus with a control sequence: $(cat -v <<<"$out" | tail -5)"
fi

echo "$checks checks"
echo "1 passed, 0 failed"
