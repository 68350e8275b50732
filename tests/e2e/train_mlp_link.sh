#!/usr/bin/env bash
# train_mlp with a modeled link (--link-gbps, --link-latency-us) and each --gemm choice: the same
# param_hash as without the link, stages 0-3 equal; the modeled time is the reported traffic over the
# bandwidth (latency 0); the exposed communication covers the modeled time; the step's parts add up.
# Usage: train_mlp_link.sh TRAIN_MLP
source "$(dirname "${BASH_SOURCE[0]}")/e2e.sh"
train_mlp=$1
common=(--json --ranks 2 --batch 8 --steps 6 --layers 3 --hidden 48)
e2e_run "$train_mlp" --help
e2e_sed gemms 's/.*--gemm TEXT:{\([^}]*\)}.*/\1/p'
gemms=${gemms//,/ }
# Prints the hash; checks the split, and with a link the modeled time against the traffic.
check() {
  python3 -c '
import json, sys
gbps, latency = float(sys.argv[1]), float(sys.argv[2])
overlap = len(sys.argv) > 3 and sys.argv[3] == "on"
j = json.loads(sys.stdin.read().strip().splitlines()[-1])
parts = j["time_compute_s"] + j["time_comm_exposed_s"] + j["time_optimizer_s"] + j["time_other_s"]
assert abs(parts - j["time_step_s"]) <= 1e-9 * max(1.0, j["time_step_s"]), j
assert min(j["time_compute_s"], j["time_comm_exposed_s"], j["time_optimizer_s"], j["time_other_s"]) >= 0, j
if gbps > 0 or latency > 0:
    assert j["link_gbps"] == gbps and j["link_latency_us"] == latency, j
    # Held calls last at least their modeled cost, and (without overlap) the time inside collectives
    # covers them; with overlap, part of the modeled time runs under the computation.
    assert j["link_modeled_s"] > 0, j
    assert overlap or j["time_comm_exposed_s"] >= j["link_modeled_s"], j
    if latency == 0:  # the protocol and the control collectives are all the traffic, bytes / beta the cost
        want = (j["comm_bytes_per_rank_per_step"] + j["comm_control_bytes_per_rank_per_step"]) / (gbps * 1e9)
        assert abs(j["link_modeled_s"] - want) <= 1e-9 * want, (j["link_modeled_s"], want)
else:
    assert "link_modeled_s" not in j and "link_gbps" not in j, j
print(j["param_hash"])' "$@"
}
# run VAR CHECK-ARGS -- FLAGS...: trains with FLAGS, checks the JSON line (check CHECK-ARGS), VAR = its hash.
run() {
  local var=$1 check_args=()
  shift
  while [ "$1" != -- ]; do check_args+=("$1"); shift; done
  shift
  e2e_run "$train_mlp" "${common[@]}" "$@"
  e2e_filter "$var" hex check "${check_args[@]}"
}
for gemm in $gemms; do
  for stage in 0 1 2 3; do
    run plain 0 0 -- --gemm "$gemm" --stage $stage
    run bw 0.5 0 -- --gemm "$gemm" --stage $stage --link-gbps 0.5 --overlap off
    run both 0.5 200 -- --gemm "$gemm" --stage $stage --link-gbps 0.5 --link-latency-us 200 --overlap off
    run over 0.5 200 on -- --gemm "$gemm" --stage $stage --link-gbps 0.5 --link-latency-us 200 --overlap on
    echo "gemm $gemm stage $stage: param_hash $plain, with a link $bw, with latency too $both, overlapped $over"
    e2e_same "$bw" "$plain" "gemm $gemm stage $stage: a link against none"
    e2e_same "$both" "$plain" "gemm $gemm stage $stage: a link with latency against none"
    e2e_same "$over" "$plain" "gemm $gemm stage $stage: an overlapped link against none"
    [ "$stage" = 0 ] && first=$plain
    e2e_same "$plain" "$first" "gemm $gemm: stage $stage against stage 0"
  done
done
# A bad link is a usage error naming the flag.
for bad in "--link-gbps 0" "--link-gbps -1" "--link-gbps nan" "--link-latency-us -5" "--link-latency-us inf"; do
  e2e_expect 2 "${bad%% *}" "$train_mlp" --steps 1 $bad
done
echo "1 passed, 0 failed"
