#!/usr/bin/env bash
# train_mlp compiled for one stage, optimizer and precision (trainer_stage/_optimizer/_precision, as
# scripts/demo.sh builds it): its flags default to that combination, it trains to the full build's
# param_hash, and it refuses every other choice with a usage error naming the build.
# Usage: train_mlp_one.sh TRAIN_MLP TRAIN_MLP_ONE   (the second compiled for stage 2, sgd, bf16)
set -u
full=$1
one=$2
status=0
fail() { echo "FAIL: $*"; status=1; }
hash_of() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['param_hash'])"; }
flags=(--layers 3 --hidden 32 --batch 16 --steps 5 --ranks 2 --clip 1 --json)
want=$("$full" --backend threads --stage 2 --optimizer sgd --precision bf16 "${flags[@]}" 2>/dev/null | hash_of)
got=$("$one" --stage 2 --optimizer sgd --precision bf16 "${flags[@]}" 2>/dev/null | hash_of)
defaults=$("$one" "${flags[@]}" 2>/dev/null | hash_of)
echo "full build: $want; one-combination build: $got; with its defaults: $defaults"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "the one-combination build gives '$got', the full build '$want'"
[ "$defaults" = "$want" ] || fail "the one-combination build's defaults are not its combination: '$defaults'"
refused() {
  local flag=$1 value=$2 err
  err=$("$one" "$flag" "$value" "${flags[@]}" 2>&1 >/dev/null)
  local rc=$?
  [ $rc -eq 2 ] || fail "$flag $value: exit $rc, expected 2"
  grep -q -- "compiled for $flag" <<<"$err" || fail "$flag $value: no 'compiled for $flag' in: $(head -c 300 <<<"$err")"
}
refused --stage 3
refused --optimizer adamw
refused --precision fp32
[ $status -eq 0 ] && echo ok
exit $status
