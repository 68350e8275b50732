#!/usr/bin/env bash
# Trains the example MLP on 4 simulated ranks (threads) with ZeRO-3 and prints the summary.
# Extra arguments go to train_mlp, e.g. scripts/demo.sh --stage 1 --ranks 8. Builds only train_mlp
# (in build/, which scripts/test.sh then completes): a fresh clone reaches the first step in the time
# of the apt install plus one compile.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" examples/train_mlp
exec "${ZERO_BUILD_DIR:-$root/build}/examples/train_mlp" --stage 3 --ranks 4 "$@"
