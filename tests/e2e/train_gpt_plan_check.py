#!/usr/bin/env python3
"""Reads train_gpt's JSON line (the last line of stdin) and checks it against its formulas and plans: model
states and traffic against the formulas; the step's transient peak, bytes and all-gathers against zero::plan;
with --checkpoint-activations, the activation store's bytes and traffic against plan_activations (one
micro-batch's loop, --accum of them per step). Prints "param_hash all_gathers gather_buckets saved host";
exits 1 naming the first figure that differs."""
import json
import sys

j = json.loads(sys.stdin.read().strip().splitlines()[-1])
problems = []


def same(what, measured, expected):
    if measured != expected:
        problems.append(f"{what}: measured {measured}, expected {expected}")


same("model-state bytes", j["model_state_bytes_per_rank"], j["model_state_formula_bytes"])
same("bytes per step", j["comm_bytes_per_rank_per_step"], j["comm_formula_bytes"])
plan = j["plan"]
same("transient peak against the plan", j["transient_peak_bytes_per_rank"], plan["transient_peak_bytes"])
same("bytes per step against the plan", j["comm_bytes_per_rank_per_step"], plan["step_bytes"])
same("all-gathers per step against the plan", j["all_gathers_last_step"], plan["all_gathers_per_step"])
saved = host = 0
a = j.get("activation_checkpoints")
if a:
    m, p = a["measured"], a["plan_per_micro_batch"]
    accum, layers = j["accum"], j["model"]["layers"]
    for measured, planned in [("peak_saved_bytes", "saved_bytes"), ("peak_host_bytes", "host_bytes"),
                              ("peak_restored_bytes", "peak_restored_bytes"),
                              ("peak_system_bytes", "peak_system_bytes")]:
        same(f"checkpoints: {measured}", m[measured], p[planned])
    same("checkpoints held after the run", m["held_at_end_bytes"], 0)
    same("checkpoints: all-gather bytes per step", m["gather_bytes_per_step"], accum * p["gather_bytes"])
    same("checkpoints: all-gathers per step", m["gathers_per_step"], accum * p["gathers"])
    same("checkpoints: bytes to host memory per step", m["to_host_bytes_per_step"], accum * p["to_host_bytes"])
    same("checkpoints: bytes from host memory per step", m["from_host_bytes_per_step"], accum * p["from_host_bytes"])
    same("checkpoints: saves per step", m["saves_per_step"], accum * layers)
    same("checkpoints: restores per step", m["restores_per_step"], accum * layers)
    same("checkpoints: prefetches per step", m["prefetches_per_step"], accum * (layers - 1))
    saved, host = m["peak_saved_bytes"], m["peak_host_bytes"]
if problems:
    print("; ".join(problems), file=sys.stderr)
    sys.exit(1)
print(j["param_hash"], j["all_gathers_last_step"], j["gather_buckets"], saved, host)
