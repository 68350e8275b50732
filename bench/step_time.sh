#!/usr/bin/env bash
# Where train_mlp's step time goes: stages 0-3 at N = 1, 2, 4 (threads), without and with a modeled link; JSON lines and a plot.
#
# The link is chosen from a first measurement so that a step's modeled communication roughly equals
# its compute: one run of N = 4, stage 3 without a link gives the step's compute time C and the bytes B
# a rank sends per step (the engine's traffic, which comm::modeled charges), and the bandwidth is
# B / C (the latency, --latency-us, adds a little on top). Each run then reports its split (compute,
# exposed communication, optimizer, other; docs/performance.md, "Step time") as one JSON line.
#
# Usage: bench/step_time.sh [--build DIR] [--out FILE.jsonl] [--steps K] [--latency-us L] [-- TRAIN_MLP_FLAGS...]
# Flags after -- go to every run (e.g. --gemm loops). Default: about 2-3 minutes on 2 cores.
set -eu
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=$root/bench/results/step_time.jsonl
steps=20
latency_us=10
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --latency-us) latency_us=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--build DIR] [--out FILE.jsonl] [--steps K] [--latency-us L] [-- TRAIN_MLP_FLAGS...]" >&2
       exit 2 ;;
  esac
done
train_mlp=$build/examples/train_mlp
[ -x "$train_mlp" ] || { echo "no $train_mlp: build it first (ninja -C $build examples/train_mlp)" >&2; exit 1; }
source "$root/bench/timed_build.sh"
require_timed_build "$build" examples_optimization
model=(--in 512 --hidden 512 --layers 8 --batch 64 --steps "$steps")
mkdir -p "$(dirname "$out")"

# The calibration run: compute time and bytes per step of N = 4, stage 3.
calibration=$("$train_mlp" --json --ranks 4 --stage 3 "${model[@]}" "${extra[@]}" 2>/dev/null | tail -n1)
read -r gbps compute_ms bytes < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
c, b = j["time_compute_s"], j["comm_bytes_per_rank_per_step"]
print(f"{b / c / 1e9:.4g}", f"{1e3 * c:.3f}", b)' "$calibration")
echo "link: $gbps GB/s, $latency_us us (N=4 stage 3: compute $compute_ms ms and $bytes bytes sent per step)" >&2

# The sweep's dimensions, each a list of flag sets (an empty string: the default). Adding a dimension
# is one line here, e.g. overlap=("--overlap on" "--overlap off"), and its name in `axes`.
stage=("--stage 0" "--stage 1" "--stage 2" "--stage 3")
ranks=("--ranks 1" "--ranks 2" "--ranks 4")
link=("" "--link-gbps $gbps --link-latency-us $latency_us")
axes=(stage ranks link)

# Every combination of the axes' flag sets, one a line.
combinations() {
  local lines=("")
  for axis in "${axes[@]}"; do
    local -n values=$axis
    local next=()
    for l in "${lines[@]}"; do
      for v in "${values[@]}"; do next+=("$l${l:+ }$v"); done
    done
    lines=("${next[@]}")
  done
  printf '%s\n' "${lines[@]}"
}

: >"$out"
while IFS= read -r flags; do
  # shellcheck disable=SC2086
  line=$("$train_mlp" --json $flags "${model[@]}" "${extra[@]}" 2>/dev/null </dev/null | tail -n1) || {
    echo "FAIL: train_mlp $flags" >&2; exit 1; }
  python3 - "$line" "$flags ${extra[*]}" "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
keep = ["stage", "ranks", "steps", "precision", "optimizer", "gemm", "param_hash", "comm_bytes_per_rank_per_step",
        "time_step_s", "time_compute_s", "time_comm_exposed_s", "time_optimizer_s", "time_other_s",
        "link_gbps", "link_latency_us", "link_modeled_s", "link_waited_s"]
r = {"bench": "step_time", "flags": sys.argv[2].strip(), "loadavg": sys.argv[3]}
r.update({k: j[k] for k in keep if k in j})
print(json.dumps(r))
ms = lambda k: 1e3 * r[k]
link = f"link {ms('link_modeled_s'):6.2f} ms modeled" if "link_modeled_s" in r else "no link"
print(f"{r['flags']:<50} step {ms('time_step_s'):7.2f} ms = compute {ms('time_compute_s'):6.2f} + comm "
      f"{ms('time_comm_exposed_s'):6.2f} + optimizer {ms('time_optimizer_s'):6.2f} + other {ms('time_other_s'):5.2f}"
      f"  ({link})", file=sys.stderr)
PY
done < <(combinations)
echo "wrote $out" >&2
# Debian's python3-matplotlib lives under /usr/bin/python3 (a python3 earlier on PATH may lack it).
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if "$py" -c 'import matplotlib' 2>/dev/null; then
  "$py" "$root/bench/plot_step_time.py" "$out" "${out%.jsonl}.png" --table
else
  echo "no matplotlib (Debian: python3-matplotlib): no plot" >&2
fi
