#!/usr/bin/env python3
"""Runs train_mlp for every stage and precision and prints a Markdown table of measured versus formula bytes."""
import json
import subprocess
import sys


def run(train_mlp, stage, precision, ranks, steps):
    cmd = [train_mlp, "--json", "--stage", str(stage), "--ranks", str(ranks), "--steps", str(steps),
           "--precision", precision]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: formula_table.py TRAIN_MLP [RANKS] [STEPS]")
    train_mlp = sys.argv[1]
    ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    print(f"train_mlp defaults (4 layers, hidden 256, in 64, 10 classes), AdamW, {ranks} ranks, {steps} steps:\n")
    print("| precision | stage | Psi (padded) | model states measured | formula | sent per step measured | formula | param_hash |")
    print("|---|---|---|---|---|---|---|---|")
    for precision in ("fp32", "bf16", "fp16"):
        for stage in range(4):
            j = run(train_mlp, stage, precision, ranks, steps)
            ok_mem = "=" if j["model_state_bytes_per_rank"] == j["model_state_formula_bytes"] else "!="
            ok_comm = "=" if j["comm_bytes_per_rank_per_step"] == j["comm_formula_bytes"] else "!="
            print(f"| {precision} | {stage} | {j['padded_params']} | {j['model_state_bytes_per_rank']} | {ok_mem} "
                  f"{j['model_state_formula_bytes']} | {j['comm_bytes_per_rank_per_step']} | {ok_comm} "
                  f"{j['comm_formula_bytes']} | `{j['param_hash']}` |")


if __name__ == "__main__":
    main()
