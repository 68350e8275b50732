#!/usr/bin/env bash
# train_mlp's param_hash pinned across the tree's history: every configuration below trains to the bits
# written here, so a refactor or a faster loop that changes one bit of any of them fails this test.
# The GEMMs are the hand-written loops (--gemm loops): OpenBLAS's kernels differ by CPU and would tie
# the hashes to one machine; everything else is the library's own, the same bits on every ISA.
# A deliberate change of the bits (a new rule, a new rounding) updates the table in the same commit.
# Usage: train_mlp_pinned.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
offload_dir=$(mktemp -d)
trap 'rm -rf "$offload_dir"' EXIT
model=(--json --gemm loops --batch 24 --steps 10 --layers 3 --hidden 48)
pinned() {  # pinned HASH FLAGS...: the run's param_hash must be HASH
  local want=$1 got
  shift
  e2e_run "$train_mlp" "${model[@]}" "$@"
  e2e_json got param_hash hex
  echo "param_hash $got: $*"
  e2e_same "$got" "$want" "train_mlp $* (pinned)"
}
# Stages x precisions, AdamW, 4 ranks: one hash per precision, every stage.
for stage in 0 1 2 3; do
  pinned 3c26da67001bdb60 --ranks 4 --stage $stage --precision fp32
  pinned ccdf701521788696 --ranks 4 --stage $stage --precision bf16
  pinned 0d7c62399c136a4b --ranks 4 --stage $stage --precision fp16
done
# The other optimizers, stage 3.
pinned eb06b55a09199e7f --ranks 4 --stage 3 --optimizer sgd
pinned 2a31d13939b9b2b5 --ranks 4 --stage 3 --optimizer adamw_bf16
pinned 280715993294d00d --ranks 4 --stage 3 --optimizer lion
pinned 9d446ae86a848121 --ranks 4 --stage 3 --optimizer lamb
pinned 84f67465348a3213 --ranks 4 --stage 3 --optimizer muon
# ZeRO++ (qwZ, qgZ over two hops, hpZ), HSDP, the disk tier and host threads.
pinned 4ded69756ce95cf9 --ranks 4 --stage 3 --qwz --qgz --hpz 2
pinned f28a76350cbc87f3 --ranks 4 --stage 3 --shard-group 2
pinned 3c26da67001bdb60 --ranks 4 --stage 2 --offload disk --offload-dir "$offload_dir"
pinned 3c26da67001bdb60 --ranks 4 --stage 1 --host-threads 2
# The host loops capped to narrower instruction sets: the same bits (AdamW's update; LAMB's passes with
# their sums of squares; the reproducible mode's binned passes).
for isa in avx2 sse2 scalar; do
  pinned 3c26da67001bdb60 --ranks 4 --stage 1 --host-isa $isa
  pinned 9d446ae86a848121 --ranks 4 --stage 3 --optimizer lamb --host-isa $isa
  pinned 0f641a97dafa9bb9 --ranks 2 --stage 3 --micro-batch 6 --reproducible --host-isa $isa
done
# The reproducible mode: one hash at any N.
for n in 1 2 4; do
  pinned 0f641a97dafa9bb9 --ranks $n --stage 3 --micro-batch 6 --reproducible
done
