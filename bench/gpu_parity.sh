#!/usr/bin/env bash
# The device paths against each other, bit for bit: train_mlp_cuda on 4 cuda_threads ranks sharing one GPU,
# for fp32 and bf16, through every stage with each optimizer, replicated shard groups (HSDP), ZeRO++ (qwZ, two-hop
# qgZ, hpZ) and an asynchronous save resumed mid-run. Each case names the hashes the determinism contract
# says must agree (docs/determinism.md); every run overlaps its collectives (the trainer's default).
# JSON lines to stdout, one per case; exit 1 if any case fails. Usage: gpu_parity.sh TRAIN_MLP_CUDA
set -u
train=$1
python3 - "$train" <<'PY'
import json, subprocess, sys, tempfile

train = sys.argv[1]
model = ["--json", "--ranks", "4", "--layers", "3", "--hidden", "256", "--in", "128", "--batch", "32",
         "--clip", "1"]
failed = 0


def run(args, steps=4):
    """The run's JSON summary, or {'exit': code, 'error': last stderr line} when it did not train."""
    try:
        p = subprocess.run([train] + model + ["--steps", str(steps)] + args, capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "error": "no answer in 120 s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines or not lines[-1].startswith("{"):
        err = p.stderr.strip().splitlines()
        return {"exit": p.returncode, "error": err[-1][:300] if err else ""}
    return json.loads(lines[-1])


def case(name, runs, same=True, formulas=True):
    """runs: {label: summary}. Passes when every run trained, their hashes agree (or differ, same=False, for
    a pair that must change the result), and each run's measured bytes equal its formulas."""
    global failed
    hashes = {k: v.get("param_hash") for k, v in runs.items()}
    problems = [f"{k}: exit {v['exit']}: {v['error']}" for k, v in runs.items() if "exit" in v]
    if not problems:
        distinct = len(set(hashes.values()))
        if same and distinct != 1:
            problems.append("hashes differ")
        if not same and distinct == 1:
            problems.append("hashes agree where they must differ")
        if formulas:
            for k, v in runs.items():
                if v["model_state_bytes_per_rank"] != v["model_state_formula_bytes"]:
                    problems.append(f"{k}: model-state bytes {v['model_state_bytes_per_rank']} != formula "
                                    f"{v['model_state_formula_bytes']}")
                if v["comm_bytes_per_rank_per_step"] != v["comm_formula_bytes"]:
                    problems.append(f"{k}: bytes sent {v['comm_bytes_per_rank_per_step']} != formula "
                                    f"{v['comm_formula_bytes']}")
    ok = not problems
    failed += not ok
    device = next((v["device"] for v in runs.values() if "device" in v), "")
    print(json.dumps({"check": "gpu_parity", "case": name, "result": "OK" if ok else "FAIL", "device": device,
                      "hashes": hashes, "problems": problems}), flush=True)


for precision in ["fp32", "bf16"]:
    p = ["--precision", precision]
    plain = {s: run(p + ["--stage", str(s)]) for s in range(4)}
    case(f"{precision}: adamw, stages 0-3", {f"stage {s}": plain[s] for s in range(4)})
    for opt in ["sgd", "lion", "adamw_bf16"]:
        case(f"{precision}: {opt}, stages 0-3",
             {f"stage {s}": run(p + ["--stage", str(s), "--optimizer", opt]) for s in range(4)})
    # Replicated shard groups: their own sum order (two levels), one hash at every stage that shards.
    case(f"{precision}: --shard-group 2, stages 1-3",
         {f"stage {s}": run(p + ["--stage", str(s), "--shard-group", "2"]) for s in (1, 2, 3)})
    # ZeRO++: hpZ alone keeps stage 3's bits, qwZ + hpZ keeps qwZ's, qwZ changes them; qgZ one hash at stages 1-3.
    q = ["--quant-block", "64"]
    case(f"{precision}: --hpz 2 against stage 3", {"stage 3": plain[3], "hpz": run(p + ["--stage", "3", "--hpz", "2"])})
    qwz = run(p + q + ["--stage", "3", "--qwz"])
    case(f"{precision}: --qwz --hpz 2 against --qwz", {"qwz": qwz, "qwz hpz": run(p + q + ["--stage", "3", "--qwz", "--hpz", "2"])})
    case(f"{precision}: --qwz changes stage 3's bits", {"stage 3": plain[3], "qwz": qwz}, same=False)
    case(f"{precision}: --qgz over two hops (--node-size 2), stages 1-3",
         {f"stage {s}": run(p + q + ["--stage", str(s), "--qgz", "--node-size", "2"]) for s in (1, 2, 3)})
    case(f"{precision}: qwZ + qgZ int4 + hpZ twice", {
        "first": run(p + q + ["--stage", "3", "--qwz", "--qgz", "--qgz-bits", "4", "--hpz", "2"]),
        "second": run(p + q + ["--stage", "3", "--qwz", "--qgz", "--qgz-bits", "4", "--hpz", "2"])})
    # An asynchronous save from device memory after 2 steps, resumed for 2 more: the bits of 4 straight steps.
    for s in (1, 3):
        with tempfile.TemporaryDirectory() as d:
            first = run(p + ["--stage", str(s), "--save", d + "/ck", "--save-async"], steps=2)
            resumed = run(p + ["--stage", str(s), "--resume", d + "/ck"], steps=2) if "exit" not in first else first
        case(f"{precision}: --save-async after 2 steps, resumed for 2, stage {s}",
             {"4 steps": plain[s], "2 + resumed 2": resumed}, formulas=False)

# The reproducible mode is a host mode: the device trainer must refuse it with a message, not train.
r = run(["--stage", "3", "--reproducible", "--micro-batch", "4"])
ok = r.get("exit") not in (None, 0, "timeout") and "reproducible" in r.get("error", "")
failed += not ok
print(json.dumps({"check": "gpu_parity", "case": "--reproducible on the device is refused", "result":
                  "OK" if ok else "FAIL", "detail": r.get("error", "it trained")}), flush=True)
print(json.dumps({"check": "gpu_parity", "case": "all", "result": "FAIL" if failed else "OK", "failed": failed}))
sys.exit(1 if failed else 0)
PY
