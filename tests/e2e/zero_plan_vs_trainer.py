#!/usr/bin/env python3
"""zero_plan against what train_mlp measures: for every stage, precision and N, the tool's bytes per
rank by category, transient peak and bytes sent per step equal those the trainer's --log records, and
its verdict on a memory size is the one the trainer's --memory-limit then reaches; the same model
described in JSON (--model) plans the same, and a bad description is refused with its place named.

Usage: zero_plan_vs_trainer.py TRAIN_MLP ZERO_PLAN"""
import json
import os
import subprocess
import sys
import tempfile

train_mlp, zero_plan = sys.argv[1], sys.argv[2]
MODEL = ["--layers", "3", "--hidden", "40", "--in", "12", "--classes", "6"]
RANKS = [1, 3, 4]
# (precision, optimizer, accum, clip): the options that change a plan's buffers and traffic.
CONFIGS = [("fp32", "adamw", 1, "0"), ("bf16", "sgd", 2, "0"), ("fp16", "adamw", 1, "1"), ("fp32", "sgd", 3, "1")]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


def plans(precision, optimizer, accum, clip, memory=None):
    cmd = [zero_plan, "--json", *MODEL, "--ranks", ",".join(map(str, RANKS)), "--precision", precision,
           "--optimizer", optimizer, "--accum", str(accum), "--clip", clip]
    if memory is not None:
        cmd += ["--memory", str(memory)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout
    return {(p["stage"], p["ranks"]): p for p in json.loads(out)["plans"]}


def train(stage, n, precision, optimizer, accum, clip, log, extra=(), overlap="off"):
    # 8 steps: fp16's dynamic loss scale skips the first few (non-finite gradients) while it falls.
    # --overlap off by default: zero_plan's default, every collective completed in its call (with
    # overlap, reduces in flight and prefetches hold more: zero_plan --overlap on, checked below).
    cmd = [train_mlp, *MODEL, "--overlap", overlap, "--stage", str(stage), "--ranks", str(n), "--batch", str(12 * n * accum), "--steps",
           "8", "--precision", precision, "--optimizer", optimizer, "--accum", str(accum), "--clip", clip, "--log",
           log, "--log-overwrite", *extra]  # one log file, replaced by each run
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


with tempfile.TemporaryDirectory() as tmp:
    log = os.path.join(tmp, "run.jsonl")
    for precision, optimizer, accum, clip in CONFIGS:
        planned = plans(precision, optimizer, accum, clip)
        for stage in range(4):
            for n in RANKS:
                what = f"stage {stage} N={n} {precision} {optimizer} accum {accum} clip {clip}"
                r = train(stage, n, precision, optimizer, accum, clip, log)
                if r.returncode != 0:
                    fail(f"{what}: train_mlp exited {r.returncode}: {r.stderr[-500:]}")
                    continue
                lines = [json.loads(x) for x in open(log)]
                steps = [x for x in lines if x["kind"] == "step" and not x["skipped"]]
                if not steps:
                    fail(f"{what}: every step was skipped; the plan assumes updates")
                    continue
                got, p = steps[-1], planned[(stage, n)]
                for key in ["params_bytes", "grads_bytes", "master_bytes", "optimizer_states_bytes",
                            "model_state_bytes"]:
                    if got[key] != p[key]:
                        fail(f"{what}: {key} measured {got[key]}, planned {p[key]}")
                if got["transient_bytes"] != 0:
                    fail(f"{what}: {got['transient_bytes']} transient bytes held after the step")
                if got["transient_peak_bytes"] != p["transient_peak_bytes"]:
                    fail(f"{what}: transient peak measured {got['transient_peak_bytes']}, planned "
                         f"{p['transient_peak_bytes']}")
                if got["bytes_sent"] != p["bytes_sent_per_step"]:
                    fail(f"{what}: bytes sent measured {got['bytes_sent']}, planned {p['bytes_sent_per_step']}")
        print(f"{precision} {optimizer} accum {accum} clip {clip}: {len(planned)} plans compared")

    # Offload to disk in slices of 1024: the tier's host memory (slice sets and checksums, counted as the
    # rank's) as planned; with it in, the peak's verdict holds as above.
    for stage, n in [(3, 3), (1, 4)]:
        what = f"stage {stage} N={n} fp32 adamw, offload disk"
        flags = ["--offload", "disk", "--offload-slice", "1024"]
        out = subprocess.run([zero_plan, "--json", *MODEL, "--ranks", str(n), "--stage", str(stage), *flags],
                             check=True, capture_output=True, text=True, timeout=60).stdout
        p = json.loads(out)["plans"][0]
        r = train(stage, n, "fp32", "adamw", 1, "0", log, [*flags, "--offload-dir", tmp])
        if r.returncode != 0:
            fail(f"{what}: train_mlp exited {r.returncode}: {r.stderr[-500:]}")
            continue
        got = [json.loads(x) for x in open(log) if json.loads(x)["kind"] == "step"][-1]
        if not (p["offload_bytes"] == got["offload_bytes"] > p["offload_staging_bytes"] > 0):
            fail(f"{what}: offload bytes measured {got['offload_bytes']}, planned {p['offload_bytes']} "
                 f"(staging {p['offload_staging_bytes']})")
        if p["master_bytes"] != got["master_bytes"] or p["optimizer_states_bytes"] != got["optimizer_states_bytes"]:
            fail(f"{what}: master/optimizer states in memory measured {got['master_bytes']}/"
                 f"{got['optimizer_states_bytes']}, planned {p['master_bytes']}/{p['optimizer_states_bytes']}")
        r = train(stage, n, "fp32", "adamw", 1, "0", log,
                  [*flags, "--offload-dir", tmp, "--memory-limit", str(p["peak_bytes"] - 1)])
        if r.returncode == 0 or "memory" not in r.stderr:
            fail(f"{what}: --memory-limit {p['peak_bytes'] - 1} exited {r.returncode}, expected a refusal")
        print(f"{what}: {p['offload_bytes']} bytes of offload host memory, as planned")

    # Overlap on (train_mlp's backend, comm::modeled over threads, overlaps; --link-gbps 5 also holds
    # each collective to a 5 GB/s link) and ZeRO++: zero_plan --overlap on and the same ZeRO++ flags
    # give the measured bytes per category, transient peak and bytes sent, and the inter-node bytes.
    ZEROPP_RUNS = [  # (stage, N, precision, flags, overlap)
        (0, 3, "bf16", [], "on"),
        (1, 4, "fp32", ["--link-gbps", "5"], "on"),
        (2, 3, "fp16", [], "on"),
        (3, 4, "bf16", ["--link-gbps", "5"], "on"),
        (1, 4, "fp32", ["--qgz", "--node-size", "2"], "on"),
        (2, 4, "bf16", ["--qgz", "--qgz-error-feedback", "--qgz-bits", "4", "--quant-block", "64"], "off"),
        (3, 4, "fp32", ["--qwz", "--qgz", "--hpz", "2"], "off"),
        (3, 4, "fp32", ["--qwz", "--qgz", "--hpz", "2", "--qgz-error-feedback", "--link-gbps", "5"], "on"),
        (3, 4, "bf16", ["--qwz", "--qwz-bits", "4", "--qgz", "--node-size", "2"], "on"),
    ]
    for stage, n, precision, flags, overlap in ZEROPP_RUNS:
        what = f"stage {stage} N={n} {precision} {' '.join(flags)} overlap {overlap}"
        plan_flags = [f for f in flags if f not in ("--link-gbps", "5")]
        out = subprocess.run([zero_plan, "--json", *MODEL, "--ranks", str(n), "--stage", str(stage), "--precision",
                              precision, "--overlap", overlap, *plan_flags],
                             check=True, capture_output=True, text=True, timeout=60).stdout
        p = json.loads(out)["plans"][0]
        r = train(stage, n, precision, "adamw", 1, "0", log, [*flags, "--json"], overlap)
        if r.returncode != 0:
            fail(f"{what}: train_mlp exited {r.returncode}: {r.stderr[-500:]}")
            continue
        got = [json.loads(x) for x in open(log) if json.loads(x)["kind"] == "step" and not json.loads(x)["skipped"]][-1]
        for key in ["params_bytes", "grads_bytes", "master_bytes", "optimizer_states_bytes", "model_state_bytes"]:
            if got[key] != p[key]:
                fail(f"{what}: {key} measured {got[key]}, planned {p[key]}")
        if got["transient_peak_bytes"] != p["transient_peak_bytes"]:
            fail(f"{what}: transient peak measured {got['transient_peak_bytes']}, planned {p['transient_peak_bytes']}")
        if got["bytes_sent"] != p["bytes_sent_per_step"]:
            fail(f"{what}: bytes sent measured {got['bytes_sent']}, planned {p['bytes_sent_per_step']}")
        inter = json.loads(r.stdout.strip().splitlines()[-1])["comm_inter_node_bytes_per_rank_per_step"]
        if inter != p["inter_node_bytes_per_step"]:
            fail(f"{what}: inter-node bytes measured {inter}, planned {p['inter_node_bytes_per_step']}")
        print(f"{what}: transient peak {p['transient_peak_bytes']}, {p['bytes_sent_per_step']} bytes sent "
              f"({p['inter_node_bytes_per_step']} between nodes), as planned")
    # The blocking plan is not the overlapped engine's: stage 3 with overlap holds more than it says.
    blocking = json.loads(subprocess.run([zero_plan, "--json", *MODEL, "--ranks", "4", "--stage", "3"], check=True,
                                         capture_output=True, text=True).stdout)["plans"][0]
    overlapped = json.loads(subprocess.run([zero_plan, "--json", *MODEL, "--ranks", "4", "--stage", "3", "--overlap",
                                            "on"], check=True, capture_output=True, text=True).stdout)["plans"][0]
    if not overlapped["transient_peak_bytes"] > blocking["transient_peak_bytes"]:
        fail(f"stage 3 N=4: --overlap on plans {overlapped['transient_peak_bytes']} transient bytes, off "
             f"{blocking['transient_peak_bytes']}: prefetches and reduces in flight should hold more")
    # With overlap, --memory plans under that limit, as --memory-limit runs: between the blocking peak and
    # the overlapped one the engine completes reduces and drops prefetches to make room, and trains with
    # the peak planned; one byte under the blocking peak it is refused.
    for memory, fits in [((blocking["peak_bytes"] + overlapped["peak_bytes"]) // 2, True),
                         (blocking["peak_bytes"] - 1, False)]:
        what = f"stage 3 N=4 fp32 overlap on, --memory {memory}"
        p = json.loads(subprocess.run([zero_plan, "--json", *MODEL, "--ranks", "4", "--stage", "3", "--overlap", "on",
                                       "--memory", str(memory)], check=True, capture_output=True,
                                      text=True).stdout)["plans"][0]
        if p["fits"] != fits:
            fail(f"{what}: zero_plan says fits {p['fits']}, expected {fits}")
        r = train(3, 4, "fp32", "adamw", 1, "0", log, ["--memory-limit", str(memory)], "on")
        if (r.returncode == 0) != fits:
            fail(f"{what}: train_mlp exited {r.returncode}: {r.stderr[-300:]}")
        elif fits:
            got = [json.loads(x) for x in open(log) if json.loads(x)["kind"] == "step"][-1]
            if got["transient_peak_bytes"] != p["transient_peak_bytes"]:
                fail(f"{what}: transient peak measured {got['transient_peak_bytes']}, planned "
                     f"{p['transient_peak_bytes']}")
        print(f"{what}: {'trains' if fits else 'refused'}, as planned")
    # Every reducer trains with overlap under a limit the blocking protocol fits: qgZ in two hops (with
    # error feedback too) leaves a reduce in flight only while what completing it takes is kept free.
    for stage, flags in [(1, ["--qgz", "--node-size", "2"]),
                         (2, ["--qgz", "--node-size", "2", "--qgz-error-feedback", "--qgz-bits", "4"])]:
        base = [zero_plan, "--json", *MODEL, "--ranks", "4", "--stage", str(stage), "--accum", "2", *flags]
        memory = json.loads(subprocess.run(base, check=True, capture_output=True,
                                           text=True).stdout)["plans"][0]["full_params_peak_bytes"]
        what = f"stage {stage} N=4 fp32 accum 2 {' '.join(flags)} overlap on, --memory {memory} (the blocking peak)"
        p = json.loads(subprocess.run(base + ["--overlap", "on", "--memory", str(memory)], check=True,
                                      capture_output=True, text=True).stdout)["plans"][0]
        if not p["fits"]:
            fail(f"{what}: zero_plan says it does not fit")
        r = train(stage, 4, "fp32", "adamw", 2, "0", log, [*flags, "--memory-limit", str(memory)], "on")
        if r.returncode != 0:
            fail(f"{what}: train_mlp exited {r.returncode}: {r.stderr[-300:]}")
            continue
        got = [json.loads(x) for x in open(log) if json.loads(x)["kind"] == "step"][-1]
        if got["transient_peak_bytes"] != p["transient_peak_bytes"]:
            fail(f"{what}: transient peak measured {got['transient_peak_bytes']}, planned {p['transient_peak_bytes']}")
        print(f"{what}: trains, transient peak {p['transient_peak_bytes']} as planned")

    # The verdict on a memory size: at the plan's peak minus one byte the trainer is refused during
    # training; at the peak that includes its final full-parameter hash it runs to the end.
    precision, optimizer, accum, clip = CONFIGS[1]
    for stage, n in [(0, 3), (1, 4), (2, 3), (3, 4)]:
        what = f"stage {stage} N={n} {precision}"
        p = plans(precision, optimizer, accum, clip)[(stage, n)]
        verdict = plans(precision, optimizer, accum, clip, memory=p["peak_bytes"] - 1)[(stage, n)]
        if verdict["fits"]:
            fail(f"{what}: zero_plan says {p['peak_bytes'] - 1} bytes fit, its peak is {p['peak_bytes']}")
        if not plans(precision, optimizer, accum, clip, memory=p["peak_bytes"])[(stage, n)]["fits"]:
            fail(f"{what}: zero_plan says its own peak {p['peak_bytes']} does not fit")
        r = train(stage, n, precision, optimizer, accum, clip, log, ["--memory-limit", str(p["peak_bytes"] - 1)])
        if r.returncode == 0 or "memory" not in r.stderr:
            fail(f"{what}: --memory-limit {p['peak_bytes'] - 1} exited {r.returncode}, expected an out-of-memory "
                 f"refusal: {r.stderr[-300:]}")
        r = train(stage, n, precision, optimizer, accum, clip, log,
                  ["--memory-limit", str(p["full_params_peak_bytes"])])
        if r.returncode != 0:
            fail(f"{what}: --memory-limit {p['full_params_peak_bytes']} (the planned peak with the final hash) "
                 f"exited {r.returncode}: {r.stderr[-300:]}")
        print(f"{what}: refused at {p['peak_bytes'] - 1} bytes, trains in {p['full_params_peak_bytes']}")

    # The same model as a JSON description gives the same plans; a bad description is refused by name.
    dims = [12, 40, 40, 6]
    units = [{"name": f"layer{l}", "tensors": [{"name": "w", "shape": [dims[l + 1], dims[l]]},
                                                {"name": "b", "shape": [dims[l + 1]]}]} for l in range(3)]
    model = os.path.join(tmp, "model.json")
    json.dump({"units": units}, open(model, "w"))
    base = [zero_plan, "--json", "--ranks", "1,3,4", "--precision", "bf16", "--accum", "2"]
    from_flags = json.loads(subprocess.run(base + MODEL, check=True, capture_output=True, text=True).stdout)
    from_file = json.loads(subprocess.run(base + ["--model", model], check=True, capture_output=True,
                                          text=True).stdout)
    if from_flags["plans"] != from_file["plans"] or from_flags["params"] != from_file["params"]:
        fail("the MLP as a JSON description plans differently from its flags")
    # A shared unit ("gathers": 2 on the largest unit): stage 3 sends two more all-gathers of it per
    # micro-batch (forward and backward), stages 0-2 the same as before; "gathers": 0 is refused.
    units[1]["gathers"] = 2
    json.dump({"units": units}, open(model, "w"))
    tied = json.loads(subprocess.run(base + ["--model", model], check=True, capture_output=True, text=True).stdout)
    for a, b in zip(from_file["plans"], tied["plans"]):
        n, m = a["ranks"], 2
        extra = 2 * m * ((n - 1) * a["gathered_bytes"] // n) if a["stage"] == 3 else 0
        if b["bytes_sent_per_step"] != a["bytes_sent_per_step"] + extra:
            fail(f"gathers 2, stage {a['stage']} N={n}: {b['bytes_sent_per_step']} bytes per step, expected "
                 f"{a['bytes_sent_per_step']} + {extra}")
    units[1]["gathers"] = 0
    json.dump({"units": units}, open(model, "w"))
    r = subprocess.run(base + ["--model", model], capture_output=True, text=True)
    if r.returncode != 1 or "unit 'layer1': \"gathers\" 0 is not a positive integer" not in r.stderr:
        fail(f"gathers 0: exit {r.returncode}, {r.stderr.strip()}")
    del units[1]["gathers"]
    units[1]["tensors"][0]["shape"] = [40, 0]
    json.dump(units, open(model, "w"))  # the bare list form
    r = subprocess.run(base + ["--model", model], capture_output=True, text=True)
    if r.returncode != 1 or "unit 'layer1' tensor 'w': shape entry 0 is not a positive integer" not in r.stderr:
        fail(f"a zero dimension: exit {r.returncode}, {r.stderr.strip()}")
    r = subprocess.run(base + ["--model", model, "--layers", "2"], capture_output=True, text=True)
    if r.returncode == 0 or "excludes" not in r.stderr:
        fail(f"--model with --layers: exit {r.returncode}, {r.stderr.strip()[:200]}")
    print("the MLP as a JSON description plans the same; a shared unit's gathers are counted; bad descriptions are "
          "refused")

print(f"{'0 failed' if failures == 0 else f'{failures} failed'}")
sys.exit(1 if failures else 0)
