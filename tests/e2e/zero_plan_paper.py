#!/usr/bin/env python3
"""zero_plan --paper-tables against the ZeRO paper (Rajbhandari et al., SC'20, arXiv:1910.02054): every
planner figure of Table 1 (model-state GB per device of the 7.5B, 128B and 1T models at DP 1-1024) and of
Table 2 (the largest model in 32 GB per device, MP 1-16 at DP 64) equals the paper's figure under the
documented rule (rounded half up or truncated to the decimals the paper prints; Table 2's rows are MP
times the MP = 1 figure as printed), and equals, byte for byte, the paper's formulas at the library's
padded Psi (each unit padded to a multiple of N x 32 elements):
  Pos: 4 Psi + K Psi/N    Pos+g: 2 Psi + (2 + K) Psi/N    Pos+g+p: (4 + K) Psi/N    baseline: (4 + K) Psi
with K = 12 and GB = 10^9 bytes. The paper's figures below are transcribed from its tables, apart from the
tool's copy, so a change to either the formulas or the tool's figures fails here.

Usage: zero_plan_paper.py ZERO_PLAN"""
import json
import subprocess
import sys

zero_plan = sys.argv[1]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL:", msg)


# Table 1 (GB): model -> (parameters, {DP: (Pos, Pos+g, Pos+g+p)}).
TABLE1 = {
    "7.5B": (7_500_000_000, {1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
                             64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"),
                             1024: ("30.1", "15.1", "0.12")}),
    "128B": (128_000_000_000, {1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
                               64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")}),
    "1T": (1_000_000_000_000, {1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"),
                               16: ("4750", "2875", "1000"), 64: ("4187", "2218", "250"),
                               256: ("4046", "2054", "62.5"), 1024: ("4011", "2013", "15.6")}),
}
# Table 2: MP -> (Baseline, Pos, Pos+g, Pos+g+p), on 64 x MP GPUs.
TABLE2 = {1: ("2B", "7.6B", "14.4B", "128B"), 2: ("4B", "15.2B", "28.8B", "256B"),
          4: ("8B", "30.4B", "57.6B", "0.5T"), 8: ("16B", "60.8B", "115.2B", "1T"),
          16: ("32B", "121.6B", "230.4B", "2T")}
GB, K, MEMORY, DP2 = 10**9, 12, 32 * 10**9, 64


def padded(psi, n):
    quantum = n * 32
    return -(-psi // quantum) * quantum


def formula_bytes(stage, psi, n):
    """The paper's model-state bytes per device (section 5), at the padded Psi the library allocates."""
    p = padded(psi, n)
    return {0: (4 + K) * p, 1: 4 * p + K * p // n, 2: 2 * p + (2 + K) * p // n, 3: (4 + K) * p // n}[stage]


def figure(text, unit):
    """(digits, quantum): '52.5' in GB is (525, 10^8 bytes); '0.5T' is (5, 10^11 parameters)."""
    if text[-1] in "BT":
        unit, text = (10**9 if text[-1] == "B" else 10**12), text[:-1]
    decimals = len(text.split(".")[1]) if "." in text else 0
    return int(text.replace(".", "")), unit // 10**decimals


def agrees(text, unit, exact):
    digits, q = figure(text, unit)
    return digits in (exact // q, (exact + q // 2) // q)


def run(*args):
    return subprocess.run([zero_plan, *args], capture_output=True, text=True, timeout=60)


r = run("--paper-tables", "--json")
try:  # exit 1 (a figure differs) still prints the tables: every cell is then checked below
    j = json.loads(r.stdout)
except json.JSONDecodeError:
    print(f"FAIL: zero_plan --paper-tables --json exited {r.returncode} without JSON: {r.stderr[-2000:]}")
    sys.exit(1)
if r.returncode != 0:
    fail(f"zero_plan --paper-tables --json exited {r.returncode}, expected 0 (every figure agreeing)")

# Table 1: every cell the paper prints, with the tool's planner bytes = the formula = the paper under the rule.
seen = 0
for model in j["table1"]:
    psi, rows = TABLE1[model["model"]]
    if model["parameters"] != psi:
        fail(f"{model['model']}: {model['parameters']} parameters, expected {psi}")
    if [row["dp"] for row in model["rows"]] != list(rows):
        fail(f"{model['model']}: DP rows {[row['dp'] for row in model['rows']]}, expected {list(rows)}")
    for row in model["rows"]:
        for cell, paper in zip(row["cells"], rows[row["dp"]]):
            seen += 1
            where = f"Table 1, {model['model']}, DP {row['dp']}, {cell['name']}"
            b = cell["planner_bytes"]
            if cell["paper"] != paper:
                fail(f"{where}: the tool prints the paper's figure as {cell['paper']}, the paper has {paper}")
            if b != formula_bytes(cell["stage"], psi, row["dp"]):
                fail(f"{where}: planner {b} bytes, the paper's formula at padded Psi {formula_bytes(cell['stage'], psi, row['dp'])}")
            if not agrees(paper, GB, b):
                fail(f"{where}: planner {b / GB:.6f} GB is not the paper's {paper} GB rounded or truncated")
            if cell["agrees"] != agrees(paper, GB, b):
                fail(f"{where}: the tool's verdict {cell['agrees']} differs from the rule's")
if seen != 54:
    fail(f"Table 1 has {seen} cells, expected 54 (3 models x 6 DP degrees x 3 stages)")

# Table 2: the largest one-device share per stage fits 32 GB by the formula and one parameter more does not;
# each row's figure is MP x that share rounded to the MP = 1 row's precision, under the rule.
t2 = j["table2"]
if (t2["memory_bytes"], t2["dp"]) != (MEMORY, DP2):
    fail(f"Table 2 plans {t2['memory_bytes']} bytes at DP {t2['dp']}, expected {MEMORY} at {DP2}")
names = ["Baseline", "Pos", "Pos+g", "Pos+g+p"]
share = {}
for stage, name in enumerate(names):
    s = t2["largest_share"][name]
    share[stage] = s
    if not (formula_bytes(stage, s, DP2) <= MEMORY < formula_bytes(stage, s + 1, DP2)):
        fail(f"Table 2, {name}: {s} parameters is not the largest one-device share within {MEMORY} bytes")
seen = 0
for row in t2["rows"]:
    mp = row["mp"]
    if row["gpus"] != DP2 * mp:
        fail(f"Table 2, MP {mp}: {row['gpus']} GPUs, expected {DP2 * mp}")
    for stage, (cell, paper) in enumerate(zip(row["cells"], TABLE2[mp])):
        seen += 1
        where = f"Table 2, MP {mp}, {names[stage]}"
        if cell["paper"] != paper:
            fail(f"{where}: the tool prints the paper's figure as {cell['paper']}, the paper has {paper}")
        if cell["planner_parameters"] != mp * share[stage]:
            fail(f"{where}: planner {cell['planner_parameters']}, expected MP x share = {mp * share[stage]}")
        _, q1 = figure(TABLE2[1][stage], 1)
        compared = mp * ((share[stage] + q1 // 2) // q1 * q1)
        if cell["compared_parameters"] != compared:
            fail(f"{where}: compared {cell['compared_parameters']}, expected {compared}")
        if not agrees(paper, 1, compared):
            fail(f"{where}: MP x the MP = 1 figure, {compared}, is not the paper's {paper}")
        if cell["agrees"] != agrees(paper, 1, compared):
            fail(f"{where}: the tool's verdict {cell['agrees']} differs from the rule's")
if seen != 20:
    fail(f"Table 2 has {seen} cells, expected 20")
if (j["figures"], j["agreeing"]) != (74, 74):
    fail(f"the tool counts {j['agreeing']} of {j['figures']} figures agreeing, expected 74 of 74")

# The table as printed: exit 0, each Table 1 cell as "planner | paper", and the verdict line.
r = run("--paper-tables")
if r.returncode != 0:
    fail(f"zero_plan --paper-tables exited {r.returncode}")
for model in j["table1"]:
    for row in model["rows"]:
        for cell in row["cells"]:
            text = f"{cell['planner_bytes'] / GB:.4f} | {cell['paper']}"
            if text not in r.stdout:
                fail(f"the printed table lacks '{text}' ({model['model']}, DP {row['dp']}, {cell['name']})")
if "74 of 74 figures agree with the paper." not in r.stdout:
    fail("the printed table does not end with '74 of 74 figures agree with the paper.'")
# It plans the paper's fixed models: any other flag than --json is refused.
r = run("--paper-tables", "--ranks", "4")
if r.returncode != 2 or "takes only --json" not in r.stderr:
    fail(f"--paper-tables --ranks 4: exit {r.returncode}, expected 2 and a refusal naming --json")

# zero_plan --paper-zero-r: section 6's and 10's figures on Table 4's 100B model (125 layers of hidden 8192,
# 12 h^2 weights each), from the formulas here: checkpoints of batch x sequence x hidden elements per layer,
# Pa's slices of ceil(E / MP) elements, the model states at the padded Psi of one MP rank's pieces at DP 25.
L, H, BATCH, SEQ, MP, DP = 125, 8192, 32, 1024, 16, 25
E = BATCH * SEQ * H
SLICE = -(-E // MP)
PIECE_UNIT = 12 * H * H // MP  # one layer's weights on one MP rank
PSI = L * padded(PIECE_UNIT, DP)
POS, POSG = formula_bytes(1, PSI, DP) // 1, 2 * PSI + (2 + K) * PSI // DP
# (section, paper as printed, the number it stands for, unit, planner, compared, needs an assumption)
ZERO_R = [
    ("Table 4", "100B", "100B", 10**9, L * 12 * H * H, L * 12 * H * H, False),
    ("6.1", "33", "33", GB, L * E * 2, L * E, True),
    ("6.1", "2", "2", GB, L * SLICE * 2, L * SLICE, True),
    ("6.1", "nearly zero", "0", GB, 0, 0, False),
    ("6.1", "2", "2", GB, L * SLICE * 2, L * SLICE, True),
    ("6.2", "12", "12", GB, 4 * 3 * 10**9, 4 * 3 * 10**9, False),
    ("10.5", "16", "16", 1, 16, 16, False),
    ("10.5", "halves", "0.5", 1000, POSG * 1000 // POS, POSG * 1000 // POS, False),
]
r = run("--paper-zero-r", "--json")
try:
    z = json.loads(r.stdout)
except json.JSONDecodeError:
    print(f"FAIL: zero_plan --paper-zero-r --json exited {r.returncode} without JSON: {r.stderr[-2000:]}")
    sys.exit(1)
if r.returncode != 0:
    fail(f"zero_plan --paper-zero-r --json exited {r.returncode}, expected 0 (every figure agreeing)")
m = z["model"]
if (m["layers"], m["hidden"], m["parameters"], m["mp"], m["dp"], m["gpus"], m["checkpoint_elements"]) != (
        L, H, L * 12 * H * H, MP, DP, 400, E):
    fail(f"--paper-zero-r plans {m}, expected 125 x 8192 (100663296000 parameters), MP 16, DP 25, 400 GPUs")
if len(z["figures"]) != len(ZERO_R):
    fail(f"--paper-zero-r prints {len(z['figures'])} figures, expected {len(ZERO_R)}")
for f, (section, paper, value, unit, planner, compared, assumed) in zip(z["figures"], ZERO_R):
    where = f"section {section}, '{f['quantity']}'"
    if (f["section"], f["paper"], f["value"], f["unit"]) != (section, paper, value, unit):
        fail(f"{where}: the tool prints {f['paper']!r} ({f['value']} in units of {f['unit']}), expected {paper!r}")
    if (f["planner"], f["compared"]) != (planner, compared):
        fail(f"{where}: planner {f['planner']}, compared {f['compared']}; the formulas give {planner}, {compared}")
    if bool(f["assumption"]) != assumed:
        fail(f"{where}: assumption {f['assumption']!r}, expected {'one' if assumed else 'none'}")
    if not agrees(value, unit, compared) or not f["agrees"]:
        fail(f"{where}: {compared} in units of {unit} is not the paper's {paper} ({value}) rounded or truncated")
if (z["figures_count"], z["agreeing"], z["agreeing_as_stated"]) != (8, 8, 5):
    fail(f"--paper-zero-r counts {z['agreeing']} of {z['figures_count']} agreeing ({z['agreeing_as_stated']} as "
         "stated), expected 8 of 8 (5)")
# Table 3's configurations: the model states by the formulas; the checkpoints in GPU memory are those kept
# plus one restored (L E b; L s b + MP s b; MP s b); Pa+cpu's L s b in CPU memory; one layer's fp16 bucket
# where gradients are sharded.
CONFIGS = [("C1", 1, "none"), ("C2", 1, "Pa"), ("C3", 2, "none"), ("C4", 2, "Pa"), ("C5", 2, "Pa+cpu")]
if [c["name"] for c in z["configurations"]] != [c[0] for c in CONFIGS]:
    fail(f"--paper-zero-r configurations {[c['name'] for c in z['configurations']]}, expected C1-C5")
for c, (name, stage, mode) in zip(z["configurations"], CONFIGS):
    states = POS if stage == 1 else POSG
    checkpoints = {"none": L * E * 2, "Pa": L * SLICE * 2 + MP * SLICE * 2, "Pa+cpu": MP * SLICE * 2}[mode]
    host = L * SLICE * 2 if mode == "Pa+cpu" else 0
    bucket = padded(PIECE_UNIT, DP) * 2 if stage == 2 else 0
    got = (c["stage"], c["activations"], c["model_state_bytes"], c["checkpoint_bytes"], c["host_bytes"],
           c["bucket_bytes"])
    if got != (stage, mode, states, checkpoints, host, bucket):
        fail(f"{name}: (stage, Pa, states, checkpoints, host, bucket) = {got}, expected "
             f"{(stage, mode, states, checkpoints, host, bucket)}")
    if c["transient_bytes"] < bucket or c["gpu_bytes"] != states + c["transient_bytes"] + checkpoints:
        fail(f"{name}: transients {c['transient_bytes']} below the bucket {bucket}, or GPU total {c['gpu_bytes']} "
             "is not states + transients + checkpoints")
r = run("--paper-zero-r")
if r.returncode != 0:
    fail(f"zero_plan --paper-zero-r exited {r.returncode}")
for f in z["figures"]:
    if f"| {f['paper']}" not in r.stdout or f"| {f['paper']} (differs)" in r.stdout:
        fail(f"the printed figures lack '| {f['paper']}' as agreeing ({f['quantity']})")
if "8 of 8 figures agree with the paper (5 as stated, 3 at the assumption named)." not in r.stdout:
    fail("the printed figures do not end with '8 of 8 figures agree with the paper (5 as stated, 3 at ...)'")
r = run("--paper-zero-r", "--tp", "2")
if r.returncode != 2 or "takes only --json" not in r.stderr:
    fail(f"--paper-zero-r --tp 2: exit {r.returncode}, expected 2 and a refusal naming --json")

if failures:
    print(f"{failures} failure(s)")
    sys.exit(1)
print("zero_plan --paper-tables: 54 figures of Table 1 and 20 of Table 2 equal the paper's under the rule, "
      "and the paper's formulas byte for byte; --paper-zero-r: 8 figures of sections 6 and 10 and Table 3's "
      "configurations equal the formulas")
