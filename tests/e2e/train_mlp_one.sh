#!/usr/bin/env bash
# train_mlp compiled for one stage, optimizer and precision (trainer_stage/_optimizer/_precision, as
# scripts/demo.sh builds it): its flags default to that combination, it trains to the full build's
# param_hash, and it refuses every other choice with a usage error naming the build.
# Usage: train_mlp_one.sh TRAIN_MLP TRAIN_MLP_ONE   (the second compiled for stage 2, sgd, bf16)
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
full=$1
one=$2
flags=(--layers 3 --hidden 32 --batch 16 --steps 5 --ranks 2 --clip 1 --json)
e2e_run "$full" --backend threads --stage 2 --optimizer sgd --precision bf16 "${flags[@]}"
e2e_json want param_hash hex
e2e_run "$one" --stage 2 --optimizer sgd --precision bf16 "${flags[@]}"
e2e_json got param_hash hex
e2e_run "$one" "${flags[@]}"
e2e_json defaults param_hash hex
echo "full build: $want; one-combination build: $got; with its defaults: $defaults"
e2e_same "$got" "$want" "the one-combination build against the full build"
e2e_same "$defaults" "$want" "the one-combination build's defaults against its combination"
refused() { e2e_expect 2 "compiled for $1" "$one" "$1" "$2" "${flags[@]}"; }
refused --stage 3
refused --optimizer adamw
refused --precision fp32
echo ok
