#!/usr/bin/env bash
# train_mlp's command line: bad flags give a usage message and exit code 2; --help exits 0.
# Usage: train_mlp_cli.sh TRAIN_MLP
set -u
train_mlp=$1
failures=0
expect() {  # expect CODE PATTERN ARGS...
  local want=$1 pattern=$2; shift 2
  out=$("$train_mlp" "$@" 2>&1); rc=$?
  if [ $rc -ne "$want" ] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: train_mlp $* -> exit $rc (want $want), output lacks /$pattern/:"; echo "$out" | head -5
    failures=$((failures + 1))
  else
    echo "ok   train_mlp $* -> exit $rc"
  fi
}
expect 2 'stage.*(not in range|0 - 3)' --stage 4
expect 2 'Usage' --stage 7
expect 2 'optimizer' --optimizer lamb
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
[ $failures -eq 0 ] && echo "1 passed, 0 failed" || { echo "0 passed, 1 failed"; exit 1; }
