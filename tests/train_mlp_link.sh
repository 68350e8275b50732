#!/usr/bin/env bash
# train_mlp with a modeled link (--link-gbps, --link-latency-us) and each --gemm choice: the same
# param_hash as without the link, stages 0-3 equal; the modeled time is the reported traffic over the
# bandwidth (latency 0); the exposed communication covers the modeled time; the step's parts add up.
# Usage: train_mlp_link.sh TRAIN_MLP
set -eu
train_mlp=$1
common=(--json --ranks 2 --batch 8 --steps 6 --layers 3 --hidden 48)
gemms=$("$train_mlp" --help | sed -n 's/.*--gemm TEXT:{\([^}]*\)}.*/\1/p' | tr ',' ' ')
[ -n "$gemms" ] || { echo "FAIL: no --gemm choices in train_mlp --help"; exit 1; }
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
    if latency == 0:  # fp32 without clipping: the protocol is all the traffic, and bytes / beta the cost
        want = j["comm_bytes_per_rank_per_step"] / (gbps * 1e9)
        assert abs(j["link_modeled_s"] - want) <= 1e-9 * want, (j["link_modeled_s"], want)
else:
    assert "link_modeled_s" not in j and "link_gbps" not in j, j
print(j["param_hash"])' "$@"
}
for gemm in $gemms; do
  for stage in 0 1 2 3; do
    plain=$("$train_mlp" "${common[@]}" --gemm "$gemm" --stage $stage 2>/dev/null | check 0 0)
    bw=$("$train_mlp" "${common[@]}" --gemm "$gemm" --stage $stage --link-gbps 0.5 --overlap off 2>/dev/null |
         check 0.5 0)
    both=$("$train_mlp" "${common[@]}" --gemm "$gemm" --stage $stage --link-gbps 0.5 --link-latency-us 200 \
             --overlap off 2>/dev/null | check 0.5 200)
    over=$("$train_mlp" "${common[@]}" --gemm "$gemm" --stage $stage --link-gbps 0.5 --link-latency-us 200 \
             --overlap on 2>/dev/null | check 0.5 200 on)
    echo "gemm $gemm stage $stage: param_hash $plain, with a link $bw, with latency too $both, overlapped $over"
    [ "$plain" = "$bw" ] && [ "$plain" = "$both" ] && [ "$plain" = "$over" ] ||
      { echo "FAIL: the link or the overlap changed the result"; exit 1; }
    [ "$stage" = 0 ] && first=$plain
    [ "$plain" = "$first" ] || { echo "FAIL: gemm $gemm: stage $stage $plain, stage 0 $first"; exit 1; }
  done
done
# A bad link is a usage error naming the flag.
for bad in "--link-gbps 0" "--link-gbps -1" "--link-gbps nan" "--link-latency-us -5" "--link-latency-us inf"; do
  set +e
  out=$("$train_mlp" --steps 1 $bad 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] && grep -q -- "${bad%% *}" <<<"$out" || { echo "FAIL: $bad: exit $rc: $out"; exit 1; }
done
echo "1 passed, 0 failed"
