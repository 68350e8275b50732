#!/usr/bin/env bash
# Trains the example MLP on 4 simulated ranks (threads) with ZeRO-3 and prints the summary.
# Extra arguments go to train_mlp, e.g. scripts/demo.sh --stage 1 --ranks 8.
# A fresh clone reaches the first step in the time of the apt install plus one small compile: each
# build-demo/<stage>-<optimizer>-<precision>/ holds train_mlp compiled for the combination the flags
# choose (Meson options trainer_stage, trainer_optimizer, trainer_precision: one engine instead of
# the 72 a full build instantiates), without MPI, tests, benchmarks or CUDA, at -O1 (as fast as -O3
# here, with the same bits). Another combination compiles once more, into its own folder; the bits
# are those of the full build in build/ (tests/e2e/train_mlp_one.sh). scripts/test.sh builds everything.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --no-build

# The combination the flags choose (the last of a repeated flag wins, as in train_mlp). A value that
# is not a plain name is left to train_mlp to refuse, in the default combination's build.
stage=3 optimizer=adamw precision=fp32
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  a=${args[i]} next=${args[i + 1]:-}
  case $a in
    --stage) stage=$next ;;
    --stage=*) stage=${a#*=} ;;
    --optimizer) optimizer=$next ;;
    --optimizer=*) optimizer=${a#*=} ;;
    --precision) precision=$next ;;
    --precision=*) precision=${a#*=} ;;
  esac
done
[[ $stage =~ ^[0-3]$ ]] || stage=3
[[ $optimizer =~ ^[a-z0-9]+$ ]] || optimizer=adamw
[[ $precision =~ ^[a-z0-9]+$ ]] || precision=fp32

build=${ZERO_DEMO_BUILD_DIR:-$root/build-demo}/$stage-$optimizer-$precision
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" -Dtests=false -Dbench=false -Dcuda=disabled -Dmpi=disabled -Doptimization=1 \
    -Dtrainer_stage="$stage" -Dtrainer_optimizer="$optimizer" -Dtrainer_precision="$precision" >&2
fi
meson compile -C "$build" examples/train_mlp >&2
exec "$build/examples/train_mlp" --stage 3 --ranks 4 "$@"
