#!/usr/bin/env bash
# train_gpt's default run (stage 3, 4 ranks, the repository's docs) learns: its losses on the training
# part and on the held-out part fall well below the unigram entropy of the same part, the best a
# model without context can do (by a quarter: the training part's own bigram entropy, the best a
# model that sees one byte back can do, is about 0.78 of its unigram entropy); it prints a sample of
# the requested length.
# Usage: train_gpt_learns.sh TRAIN_GPT
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_gpt=$1
out=$e2e_work/out
start=$(date +%s.%N)
e2e_run "$train_gpt" --json
end=$(date +%s.%N)
printf '%s\n' "$e2e_out" >"$out"
head -n -1 "$out"
python3 - "$out" "$start" "$end" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("default run: %.1f s, %.1f ms per step" % (float(sys.argv[3]) - float(sys.argv[2]), j["ms_per_step"]))
assert j["stage"] == 3 and j["ranks"] == 4 and j["precision"] == "fp32", j
for part in ["train", "held_out"]:
    loss = j["loss_train_eval" if part == "train" else "loss_held_out"]
    h = j["unigram_entropy_" + part]
    print("%s: loss %.4f nats, unigram entropy %.4f nats, %.0f%% below" % (part, loss, h, 100 * (1 - loss / h)))
    assert loss < 0.75 * h, (part, loss, h)
assert len(j["sample"]) >= 200, j["sample"]
PY
echo "1 passed, 0 failed"
