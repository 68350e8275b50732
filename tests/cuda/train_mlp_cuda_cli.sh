#!/usr/bin/env bash
# train_mlp_cuda's command line, which needs no GPU: bad flags give a usage message and exit code 2.
# Usage: train_mlp_cuda_cli.sh TRAIN_MLP_CUDA
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/e2e.sh"
train=$1
expect() {  # expect CODE PATTERN ARGS...
  local want=$1 pattern=$2
  shift 2
  e2e_expect "$want" "$pattern" "$train" "$@"
  echo "ok   train_mlp_cuda $* -> exit $e2e_rc"
}
expect 2 'stage.*(not in range|0 - 3|outside \[0, 3\])' --stage 4
expect 2 'backend' --backend threads
expect 2 'optimizer' --optimizer adafactor
expect 2 'runs on host systems only' --optimizer lamb
expect 2 'runs on host systems only' --optimizer muon
expect 2 'multiple of --ranks' --ranks 3 --batch 64
expect 2 'ranks' --ranks 0
expect 2 'ranks' --ranks 65
expect 2 'lr' --lr -1
expect 2 'unrecognized|Extras|not expected' --no-such-flag
expect 2 'multiple of --ranks 4 times --accum 3' --accum 3
expect 2 'steps 0 only makes sense with --resume' --steps 0
expect 2 'precision' --precision fp8
expect 2 'resume' --resume /nonexistent/checkpoint
expect 0 'Usage' --help
# The help lists the optimizers the device runs, and no other (train_mlp_cuda_stages.sh trains each one it lists).
e2e_sed listed 's/.*--optimizer TEXT:{\([^}]*\)}.*/\1/p'
e2e_same "$listed" "sgd, adamw, adamw_bf16, lion" "the optimizers --help lists"
echo "ok   train_mlp_cuda --help lists $listed"
echo "1 passed, 0 failed"
