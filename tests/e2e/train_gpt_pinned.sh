#!/usr/bin/env bash
# train_gpt's param_hash pinned across the tree's history, for what only train_gpt runs: the dp x tp mesh
# (Megatron's layout inside ZeRO) at every stage and precision, sequence parallelism, activation
# checkpoints (Pa, Pa+cpu) with stage 3's gather buckets, the reproducible mode inside the mesh
# and accumulation with clipping. (HSDP, LAMB and Muon inside a tensor-parallel mesh are refused by the
# engine; train_mlp_pinned.sh pins them without one.) Every configuration trains to the bits
# written here, so a refactor that changes one bit of any of them fails this test; a deliberate change of
# the bits updates the table in the same commit. The corpus is written here (not the repository's docs,
# which change), and the kernels are the example's own loops: the same bits on every ISA.
# Usage: train_gpt_pinned.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
for i in $(seq 1 40); do
  echo "The engine, line $i of a fixed corpus, partitions states, gradients and parameters over $((i % 7 + 1)) ranks."
done >"$e2e_work/corpus.txt"
model=(--json --data "$e2e_work/corpus.txt" --embd 32 --heads 4 --layers 2 --context 16 --batch 8 --steps 5
       --eval-windows 4 --sample 0)
pinned() {  # pinned HASH FLAGS...: the run's param_hash must be HASH
  local want=$1 got
  shift
  e2e_run "$train_gpt" "${model[@]}" "$@"
  e2e_json got param_hash hex
  echo "param_hash $got: $*"
  e2e_same "$got" "$want" "train_gpt $* (pinned)"
}
# The 2 x 2 mesh, every stage: one hash per precision (fp16 with its loss scale).
for stage in 0 1 2 3; do
  pinned bbb6ea78727a630f --ranks 4 --tp 2 --stage $stage
  pinned 81fa45f11b81c0a7 --ranks 4 --tp 2 --stage $stage --precision bf16
done
pinned c5e380576e4cab5d --ranks 4 --tp 2 --stage 3 --precision fp16
# Sequence parallelism and activation checkpoints keep the mesh's bits.
pinned bbb6ea78727a630f --ranks 4 --tp 2 --stage 2 --sequence-parallel
pinned bbb6ea78727a630f --ranks 4 --tp 2 --stage 3 --checkpoint-activations pa --gather-bucket-elements 8192
pinned bbb6ea78727a630f --ranks 4 --tp 2 --stage 1 --sequence-parallel --checkpoint-activations whole
# A 1 x 4 mesh, and 4 x 2 with accumulation and clipping.
pinned 8c4444ec8bf9f816 --ranks 4 --tp 4 --stage 3
pinned 8c4444ec8bf9f816 --ranks 4 --tp 4 --stage 1 --sequence-parallel --checkpoint-activations whole
pinned f953cb557e572b6e --ranks 8 --tp 2 --stage 3 --accum 2 --clip 0.5 --checkpoint-activations pa-cpu
# The reproducible mode: the same bits at dp 1 and 2.
pinned ad904a30ea3069d8 --ranks 2 --tp 2 --stage 0 --micro-batch 2 --reproducible
pinned ad904a30ea3069d8 --ranks 4 --tp 2 --stage 3 --micro-batch 2 --reproducible
echo "1 passed, 0 failed"
