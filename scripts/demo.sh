#!/usr/bin/env bash
# Trains the example MLP on 4 simulated ranks (threads) with ZeRO-3 and prints the summary.
# Extra arguments go to train_mlp, e.g. scripts/demo.sh --stage 1 --ranks 8.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
exec "${ZERO_BUILD_DIR:-$root/build}/examples/train_mlp" --stage 3 --ranks 4 "$@"
