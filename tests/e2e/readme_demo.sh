#!/usr/bin/env bash
# The output README.md shows for scripts/demo.sh is what train_mlp prints for that run (its defaults at
# stage 3 on 4 ranks), line for line but the times, which are the machine's. A build whose GEMMs are
# not the README's (OpenBLAS or the hand-written loops, which sum in another order) is held to every
# line but the loss, accuracy and param_hash.
# Usage: readme_demo.sh SOURCE_ROOT TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
root=$1 train_mlp=$2
readme="$root/README.md"
# The first plain ``` block that starts with the summary's first line.
shown=$(awk '/^```$/ {if (on) exit; fence=1; next} fence && /^ZeRO stage / {on=1} {fence=0} on' "$readme")
[ -n "$shown" ] || e2e_fail "no block of train_mlp's summary (a line starting 'ZeRO stage ') in README.md"
# scripts/demo.sh runs: train_mlp --stage 3 --ranks 4 "$@"
grep -q -- '--stage 3 --ranks 4 "\$@"' "$root/scripts/demo.sh" ||
  e2e_fail "scripts/demo.sh no longer runs train_mlp --stage 3 --ranks 4: update this test and README.md"
e2e_run "$train_mlp" --stage 3 --ranks 4
measured=$(sed '/^$/d' <<<"$e2e_out")

gemm() { sed -n 's/.*(GEMMs: \([a-z]*\))$/\1/p' <<<"$1"; }
shown_gemm=$(gemm "$shown") measured_gemm=$(gemm "$measured")
[ -n "$shown_gemm" ] || e2e_fail "README.md's summary has no '(GEMMs: ...)' step line"
[ -n "$measured_gemm" ] || e2e_fail "train_mlp's summary has no '(GEMMs: ...)' step line"
# Times become T; with other GEMMs the lines of the loss and the parameters' hash go.
masked() {
  local drop='^$'
  [ "$shown_gemm" = "$measured_gemm" ] || drop='^  loss |param_hash'
  sed -E -e 's/ in [0-9.]+ s$/ in T s/' -e '/^  step [0-9]/s/[0-9]+(\.[0-9]+)?/T/g' -e 's/\(GEMMs: [a-z]+\)$/(GEMMs)/' <<<"$1" |
    grep -Ev "$drop"
}
if [ "$(masked "$shown")" != "$(masked "$measured")" ]; then
  diff <(masked "$shown") <(masked "$measured") || true
  e2e_fail "README.md's output of scripts/demo.sh differs from train_mlp --stage 3 --ranks 4 (times masked)"
fi
echo "README's demo output matches train_mlp --stage 3 --ranks 4 (GEMMs: $measured_gemm, README's: $shown_gemm)"
