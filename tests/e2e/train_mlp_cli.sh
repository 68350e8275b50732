#!/usr/bin/env bash
# train_mlp's command line: bad flags give a usage message and exit code 2; --help exits 0.
# Usage: train_mlp_cli.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
expect() {  # expect CODE [--] PATTERN ARGS...  (-- lets a pattern start with a dash)
  local want=$1; shift
  [ "$1" = -- ] && shift
  local pattern=$1; shift
  e2e_expect "$want" "$pattern" "$train_mlp" "$@"
  echo "ok   train_mlp $* -> exit $e2e_rc"
}
expect 2 'stage.*(not in range|0 - 3|outside \[0, 3\])' --stage 4
expect 2 'Usage' --stage 7
expect 2 'optimizer' --optimizer adafactor
expect 2 'multiple of --ranks' --ranks 3 --batch 64
expect 2 'ranks' --ranks 0
expect 2 'lr' --lr -1
expect 2 'unrecognized|Extras|not expected' --no-such-flag
expect 2 'steps' --steps abc
expect 2 'precision' --precision fp8
expect 2 'save' --save-every 5
expect 2 'resume|[Dd]irectory' --resume /nonexistent/checkpoint
expect 2 'times --accum 3' --accum 3 --batch 64
expect 2 'clip' --clip -1
expect 2 'comm-timeout' --comm-timeout 0
expect 2 'comm-timeout' --comm-timeout nan
expect 2 'comm-timeout' --comm-timeout -5
expect 0 'loss' --steps 3 --hidden 16 --layers 2 --comm-timeout 0.5
expect 2 'steps 0 only makes sense with --resume' --steps 0
# Values are checked as the program uses them, after conversion to float or uint64 (issue 9, case 10).
expect 2 -- '--lr.*outside the range of a 32-bit float' --lr 1e39            # would become inf
expect 2 -- '--lr.*outside the range of a 32-bit float' --lr 1e-50           # would become 0 (the default)
expect 2 -- '--lr.*not a finite number' --lr nan
expect 2 -- '--lr.*not a finite number' --lr inf
expect 2 -- '--lr.*must be > 0' --lr 0
expect 2 -- '--clip.*not a finite number' --clip nan
expect 2 -- '--clip.*outside the range' --clip 1e39
expect 2 -- '--seed.*not a decimal integer' --seed -1
expect 2 -- '--seed.*not a decimal integer' --seed 18446744073709551616  # 2^64
expect 0 '"param_hash"' --seed 18446744073709551615 --lr 1e-3 --clip 0 --steps 1 --hidden 16 --layers 2 --json
# Output targets are refused before training, not after it.
tmp=$e2e_work
touch "$tmp/file"
mkfifo "$tmp/fifo"
mkdir -p "$tmp/version" && echo '{}' >"$tmp/version/manifest.json"
expect 2 -- '--save: an empty path' --save ''
expect 2 -- '--export: an empty path' --export ''
expect 2 -- "--save: '$tmp/file' exists and is not a directory" --save "$tmp/file"
expect 2 -- "--save: '$tmp/file' is not a directory" --save "$tmp/file/sub/dir"
expect 2 -- "--save: '$tmp/version' is one checkpoint version" --save "$tmp/version"
expect 2 -- "--export: '$tmp' is a directory" --export "$tmp"
expect 2 -- "--export: the directory '$tmp/missing' does not exist" --export "$tmp/missing/w.safetensors"
expect 2 -- "--export: '$tmp/file' is not a directory" --export "$tmp/file/w.safetensors"
expect 2 -- "--export: '$tmp/fifo' exists and is not a regular file" --export "$tmp/fifo"
if [ "$(id -u)" -ne 0 ]; then  # root may write anywhere: the permission cases need another user
  mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
  expect 2 -- "--save: cannot create the directory '$tmp/ro/ckpt'" --save "$tmp/ro/ckpt"
  expect 2 -- "--export: cannot create '$tmp/ro/w.safetensors': nothing can be created in '$tmp/ro'" --export "$tmp/ro/w.safetensors"
else
  echo "skip unwritable --save/--export targets (running as root)"
fi
# A --save directory that does not exist yet is created, parents included, by the save.
expect 0 'loss' --save "$tmp/new/nested/ckpt" --export "$tmp/w.safetensors" --steps 1 --hidden 16 --layers 2
manifests=("$tmp"/new/nested/ckpt/v-*/manifest.json)
[ -f "${manifests[0]}" ] && [ -s "$tmp/w.safetensors" ] || e2e_fail "--save/--export into new paths wrote nothing"
expect 0 'Usage' --help
# --memory-limit: model states over the budget are refused before allocation, naming every category
# and the stages that fit; transient buffers over it fail when allocated; a budget that holds both runs.
expect 1 'rank [0-3]: out of memory: the model states of ZeRO stage 0 at N = 4 need [0-9]+ bytes on this rank \(params [0-9]+, grads [0-9]+, master 0, optimizer_states [0-9]+\), more than the memory_limit_bytes budget of 1000000 bytes; nothing was allocated. Stages whose model states would fit at N = 4: stage 3 \([0-9]+ bytes\)' \
  --stage 0 --steps 1 --memory-limit 1000000
expect 1 'would fit at N = 4: none' --stage 2 --steps 1 --memory-limit 1000
expect 1 'out of memory: allocating [0-9]+ bytes of transient would hold' --stage 3 --steps 1 --memory-limit 1000000
expect 0 'loss' --stage 3 --steps 1 --memory-limit 2000000
expect 2 'memory-limit' --memory-limit -5
expect 0 'loss' --steps 3 --hidden 16 --layers 2
echo "1 passed, 0 failed"
