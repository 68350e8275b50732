#!/usr/bin/env bash
# Trains the example MLP on 4 simulated ranks (threads) with ZeRO-3 and prints the summary.
# Extra arguments go to train_mlp, e.g. scripts/demo.sh --stage 1 --ranks 8.
# A fresh clone reaches the first step in the time of the apt install plus one compile: build-demo/
# holds train_mlp alone, without MPI (threads only), tests, benchmarks or CUDA, at -O1 (the demo
# runs as fast as at -O3, whose compile takes 2.4 times as long; the results are bit-identical
# either way). scripts/test.sh builds everything in build/.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --no-build
build=${ZERO_DEMO_BUILD_DIR:-$root/build-demo}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dtests=false -Dbench=false -Dcuda=disabled -Dmpi=disabled -Doptimization=1 >&2
fi
meson compile -C "$build" examples/train_mlp >&2
exec "$build/examples/train_mlp" --stage 3 --ranks 4 "$@"
