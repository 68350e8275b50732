#!/usr/bin/env bash
# The GPU trainer at a scale where memory decides: a 2.43B-parameter MLP on 4 cuda_threads ranks sharing
# one GPU. Stage 0 must be refused before anything is allocated, naming the stages that fit; stage 3
# must train, with set-up time and host memory that fall with N (each rank initializes only its shard);
# stage 0 with --offload host must train (the optimizer states in host memory).
# JSON lines to stdout. Usage: gpu_scale.sh TRAIN_MLP_CUDA
set -u
train=$1
python3 - "$train" <<'PY'
import json, resource, subprocess, sys, time

train = sys.argv[1]
model = ["--layers", "11", "--hidden", "16384", "--in", "1024", "--batch", "64"]

def run(args):
    """Runs the trainer; returns (exit code, wall seconds, max RSS in bytes, stdout, stderr)."""
    t0 = time.time()
    p = subprocess.run([train] + model + args, capture_output=True, text=True, timeout=240)
    wall = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest child so far
    return p.returncode, wall, rss, p.stdout, p.stderr

# Stage 0: 16 bytes per parameter on each of the 4 ranks (156 GB) cannot fit in one GPU's memory.
code, wall, _, out, err = run(["--stage", "0", "--ranks", "4", "--steps", "1"])
message = err.strip().splitlines()[-1] if err.strip() else ""
print(json.dumps({"bench": "gpu_scale", "case": "stage0_refused", "exit": code, "seconds": round(wall, 2),
                  "refused_before_allocation": code != 0 and "out of memory" in message
                  and "nothing was allocated" in message,
                  "message": message[:600]}))

# Stage 3: trains; the set-up (engine construction and initialization) per rank is reported by the
# trainer; max RSS is the process's (4 ranks are threads of it).
code, wall, rss, out, err = run(["--stage", "3", "--ranks", "4", "--steps", "2", "--json"])
line = out.strip().splitlines()[-1] if out.strip() else "{}"
try:
    j = json.loads(line)
except ValueError:
    j = {}
print(json.dumps({"bench": "gpu_scale", "case": "stage3_trains", "exit": code, "seconds": round(wall, 2),
                  "params": j.get("params"), "model_state_bytes_per_rank": j.get("model_state_bytes_per_rank"),
                  "model_state_formula_bytes": j.get("model_state_formula_bytes"),
                  "setup_seconds": j.get("setup_seconds"), "setup_cpu_seconds": j.get("setup_cpu_seconds"),
                  "max_rss_bytes": rss, "loss_first": j.get("loss_first"),
                  "error": "" if code == 0 else (err.strip().splitlines() or [""])[-1][:600]}))
failed = code != 0

# Stage 0 with the master weights and slots in host memory (--offload host): the device keeps the
# parameters and gradients (8 bytes per parameter per rank, 78 GB for the 4 ranks), the host the 8
# bytes of AdamW's slots; the host loops update. One step.
code, wall, rss, out, err = run(["--stage", "0", "--ranks", "4", "--steps", "1", "--json", "--offload", "host"])
line = out.strip().splitlines()[-1] if out.strip() else "{}"
try:
    j = json.loads(line)
except ValueError:
    j = {}
print(json.dumps({"bench": "gpu_scale", "case": "stage0_offload_host_trains", "exit": code, "seconds": round(wall, 2),
                  "params": j.get("params"), "model_state_bytes_per_rank": j.get("model_state_bytes_per_rank"),
                  "model_state_formula_bytes": j.get("model_state_formula_bytes"),
                  "offload_bytes_per_rank": j.get("offload_bytes_per_rank"),
                  "offload_formula_bytes": j.get("offload_formula_bytes"),
                  "offload_moved_bytes_per_step": j.get("offload_moved_bytes_per_step"),
                  "offload_moved_formula_bytes": j.get("offload_moved_formula_bytes"),
                  "time_step_s": j.get("time_step_s"), "max_rss_bytes": rss,
                  "error": "" if code == 0 else (err.strip().splitlines() or [""])[-1][:600]}))
sys.exit(1 if failed or code != 0 else 0)
PY
