#!/usr/bin/env bash
# The GPU check, one script for a GPU machine: builds with CUDA (sm_90), runs the gpu test suite and the
# GPU benches, and writes JSON lines to $OUT/gpu.jsonl (bench/results/gpu.jsonl when OUT is unset).
# Sized for about 8 minutes on one H200 (the 2.43B-parameter runs of bench/gpu_scale.sh, last, are most of
# it; ZERO_GPU_SCALE=0 leaves them out). The build alone took more than 300 s there when train_mlp was -O3. Before copying the tree to a machine without the Debian -dev
# packages, run bench/prepare_gpu_carry.sh here and carry .gpu-carry/ along.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -n "${OUT:-}" ]; then results=$OUT/gpu.jsonl; else results=$root/bench/results/gpu.jsonl; fi
mkdir -p "$(dirname "$results")"
build=${ZERO_GPU_BUILD_DIR:-$root/build-gpu}
arch=${ZERO_GPU_ARCH:-sm_90}
t0=$(date +%s)
status=0

log() { echo "[gpu_check $(($(date +%s) - t0))s] $*" >&2; }
emit() { echo "$1" | tee -a "$results"; }  # one JSON line to the results and to stdout
json_string() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

# ---- the machine --------------------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
emit "{\"check\": \"machine\", \"gpu\": $(json_string "${gpu:-unknown}"), \"nvcc\": $(json_string "$(nvcc --version 2>/dev/null | tail -1)"), \"cpus\": $(nproc), \"date\": $(json_string "$(date -u +%FT%TZ)")}"

# ---- configure: NCCL and the header-only dependencies from wherever they are ------------------------
# gpu_trainer_optimization=3: train_mlp_cuda's host code at -O3 for the device figures (the default is
# 1, scripts/test.sh's g; device code is -O3 either way). train_mlp, needed only by the checkpoint test,
# stays at -O1: at -O3 it compiled for more than 300 s on the H200 machine's 16 cores, alone.
setup_args=(-Dcuda=enabled "-Dgpu_arch=$arch" -Dmpi=disabled -Dbuildtype=release -Dgpu_trainer_optimization=3
            -Dexamples_optimization=1)
# The nvidia-nccl wheel ships include/ and lib/libnccl.so.2, without the libnccl.so link the linker
# looks for: a small root next to the build dir gets both.
nccl_pkg=$(python3 - 2>/dev/null <<'PY'
import os
import nvidia.nccl as m
print(os.path.dirname(m.__file__) if getattr(m, "__file__", None) else list(m.__path__)[0])
PY
) || nccl_pkg=""
if [ -n "$nccl_pkg" ] && [ -d "$nccl_pkg/lib" ] && [ -d "$nccl_pkg/include" ]; then
  nccl_root=$build-nccl
  mkdir -p "$nccl_root/lib"
  ln -sfn "$nccl_pkg/include" "$nccl_root/include"
  so=$(ls "$nccl_pkg"/lib/libnccl.so* 2>/dev/null | head -1)
  [ -n "$so" ] && ln -sf "$so" "$nccl_root/lib/libnccl.so"
  setup_args+=("-Dnccl_root=$nccl_root")
  export LD_LIBRARY_PATH=$nccl_pkg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  log "NCCL from $nccl_pkg"
fi
# NCCL's bootstrap needs a socket interface; loopback always exists on a one-machine check.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
if [ -d "$root/.gpu-carry/include" ]; then
  setup_args+=(-Dextra_include_dir=.gpu-carry/include)
  log "header-only dependencies from .gpu-carry/include"
fi
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" "${setup_args[@]}" >&2 || status=1
else
  meson setup "$build" "${setup_args[@]}" >&2 || { log "meson setup failed"; exit 1; }
fi

# ---- build only what the GPU check runs ---------------------------------------------------------
targets=(tests/cuda/test_gpu_kernels tests/cuda/test_gpu_collectives tests/cuda/test_gpu_engine tests/cuda/device_probe
         examples/train_mlp_cuda examples/train_mlp bench/gpu_optimizer)
log "building ${targets[*]}"
if ! timeout 480 ninja -C "$build" -j "$(nproc)" "${targets[@]}" >&2; then
  emit "{\"check\": \"build\", \"result\": \"FAIL\", \"seconds\": $(($(date +%s) - t0))}"
  exit 1
fi
emit "{\"check\": \"build\", \"result\": \"OK\", \"seconds\": $(($(date +%s) - t0))}"

# Without a device there is nothing more to learn (the build itself is what CI checks); a device the
# runtime cannot use (a broken or too old driver: the probe exits 1) fails the check.
probe_rc=0
"$build/tests/cuda/device_probe" || probe_rc=$?
if [ "$probe_rc" -eq 77 ]; then
  emit "{\"check\": \"gpu_check\", \"result\": \"SKIP\", \"reason\": \"no CUDA device\", \"seconds\": $(($(date +%s) - t0))}"
  exit 77
elif [ "$probe_rc" -ne 0 ]; then
  emit "{\"check\": \"gpu_check\", \"result\": \"FAIL\", \"reason\": \"the CUDA device cannot be used (device_probe exit $probe_rc)\", \"seconds\": $(($(date +%s) - t0))}"
  exit 1
fi

# ---- the gpu suite --------------------------------------------------------------------------------
log "meson test --suite gpu"
timeout 300 meson test -C "$build" --no-rebuild --suite gpu --print-errorlogs >&2 || status=1
python3 - "$build/meson-logs/testlog.json" >>"$results" <<'PY' || status=1
import json, sys
# The log holds the tests of this `meson test --suite gpu` run alone (Meson's names and suite fields
# differ between its versions, so they are not matched).
found = 0
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    t = json.loads(line)
    found += 1
    print(json.dumps({"check": "gpu_test", "name": t["name"], "result": t["result"],
                      "seconds": round(t.get("duration", 0), 2)}))
if not found:
    print("gpu_check: the test log holds no test", file=sys.stderr)
    sys.exit(1)
PY
# On a GPU machine a skipped GPU test is a failure too: it could not see the device.
gpu_tests=$(python3 -c 'import sys; print(sum(1 for l in open(sys.argv[1]) if l.strip()))' \
  "$build/meson-logs/testlog.json" 2>/dev/null || echo 0)
grep '"check": "gpu_test"' "$results" | tail -n "${gpu_tests:-1}" | grep -vq '"result": "OK"' && status=1

# ---- the device paths against each other: stages x precisions x optimizers, HSDP, ZeRO++, async save --
log "parity of the device paths (bench/gpu_parity.sh)"
timeout 300 bash "$root/bench/gpu_parity.sh" "$build/examples/train_mlp_cuda" | tee -a "$results" || status=1

# ---- benches --------------------------------------------------------------------------------------
log "optimizer-kernel bandwidth against the copy bandwidth"
timeout 120 "$build/bench/gpu_optimizer" | tee -a "$results" || status=1

# Stage 3 against stage 0 on 4 cuda_threads ranks sharing the GPU: a 105M-parameter MLP (1024 inputs,
# 7 hidden layers of 4096), fp32 AdamW; the mean step time over 40 steps (set-up excluded, the first
# steps included).
log "stage 3 vs stage 0 step time (cuda_threads)"
step_args=(--json --ranks 4 --layers 8 --hidden 4096 --in 1024 --batch 256 --steps 40)
s0=$(timeout 150 "$build/examples/train_mlp_cuda" --stage 0 "${step_args[@]}" 2>/dev/null | tail -1) || status=1
s3=$(timeout 150 "$build/examples/train_mlp_cuda" --stage 3 "${step_args[@]}" 2>/dev/null | tail -1) || status=1
python3 - "${s0:-}" "${s3:-}" >>"$results" <<'PY' || status=1
import json, sys
if not sys.argv[1].startswith("{") or not sys.argv[2].startswith("{"):
    print(json.dumps({"bench": "gpu_step_time", "result": "FAIL", "reason": "train_mlp_cuda printed no JSON"}))
    sys.exit(1)
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t0, t3 = a["seconds"] / a["steps"], b["seconds"] / b["steps"]
print(json.dumps({"bench": "gpu_step_time", "backend": "cuda_threads", "device": a["device"], "ranks": a["ranks"],
                  "params": a["params"], "steps": a["steps"], "stage0_step_s": t0, "stage3_step_s": t3,
                  "stage3_over_stage0": t3 / t0,
                  "stage0_model_state_bytes_per_rank": a["model_state_bytes_per_rank"],
                  "stage3_model_state_bytes_per_rank": b["model_state_bytes_per_rank"],
                  "param_hash_equal": a["param_hash"] == b["param_hash"]}))
PY
tail -n 1 "$results"

# Offload to host memory: every stage gives the param_hash of no offload, and the tier's bytes and the
# bytes moved per step equal their formulas (fp32 and bf16, 2 ranks sharing the GPU).
log "offload to host memory: the bits and the formulas"
for precision in fp32 bf16; do
  for stage in 0 1 2 3; do
    off_args=(--json --ranks 2 --layers 4 --hidden 512 --in 256 --batch 64 --steps 5 --clip 1 --precision $precision
              --stage $stage)
    a=$(timeout 60 "$build/examples/train_mlp_cuda" "${off_args[@]}" 2>/dev/null | tail -1) || status=1
    b=$(timeout 60 "$build/examples/train_mlp_cuda" "${off_args[@]}" --offload host 2>/dev/null | tail -1) || status=1
    python3 - "${a:-}" "${b:-}" >>"$results" <<'PY' || status=1
import json, sys
if not sys.argv[1].startswith("{") or not sys.argv[2].startswith("{"):
    print(json.dumps({"bench": "gpu_offload", "result": "FAIL", "reason": "train_mlp_cuda printed no JSON"}))
    sys.exit(1)
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = (a["param_hash"] == b["param_hash"] and b["offload_bytes_per_rank"] == b["offload_formula_bytes"]
      and b["offload_moved_bytes_per_step"] == b["offload_moved_formula_bytes"]
      and b["model_state_bytes_per_rank"] == b["model_state_formula_bytes"])
print(json.dumps({"bench": "gpu_offload", "stage": a["stage"], "precision": a["precision"],
                  "param_hash_equal": a["param_hash"] == b["param_hash"], "formulas_equal": ok,
                  "step_s": a["seconds"] / a["steps"], "offload_host_step_s": b["seconds"] / b["steps"],
                  "offload_moved_bytes_per_step": b["offload_moved_bytes_per_step"],
                  "result": "OK" if ok else "FAIL"}))
sys.exit(0 if ok else 1)
PY
    tail -n 1 "$results"
  done
done

# The step against its floor on 1 rank (--roofline): the same cuBLAS GEMMs alone plus the optimizer's
# bytes at the device copy bandwidth, fp32 (plain SGEMM, no TF32) and bf16 (tensor cores).
log "roofline of the 1-rank step, fp32 and bf16"
for precision in fp32 bf16; do
  line=$(timeout 150 "$build/examples/train_mlp_cuda" --json --roofline --ranks 1 --stage 0 --layers 8 --hidden 4096 \
           --in 1024 --batch 256 --steps 40 --precision $precision 2>/dev/null | tail -1) || status=1
  python3 - "${line:-}" >>"$results" <<'PY' || status=1
import json, sys
if not sys.argv[1].startswith("{"):
    print(json.dumps({"bench": "gpu_step_roofline", "result": "FAIL", "reason": "train_mlp_cuda printed no JSON"}))
    sys.exit(1)
j = json.loads(sys.argv[1])
print(json.dumps({"bench": "gpu_step_roofline", "precision": j["precision"], "params": j["params"],
                  "batch": 256, "step_s": j["step_s"], "gemm_s": j["gemm_s"],
                  "optimizer_at_copy_s": j["optimizer_at_copy_s"], "copy_gbps": j["copy_gbps"],
                  "roofline_ratio": j["roofline_ratio"], "loss_first": j["loss_first"], "loss_last": j["loss_last"]}))
PY
  tail -n 1 "$results"
done

# Last, as the longest part (ZERO_GPU_SCALE=0 leaves it out): a 2.43B-parameter model on 4 ranks: stage 0
# refused up front, stage 3 trains with set-up per rank that falls with N, stage 0 trains with --offload
# host (bench/gpu_scale.sh).
log "2.43B parameters on 4 ranks: stage 0 refused, stage 3 trains, stage 0 with host offload trains"
[ "${ZERO_GPU_SCALE:-1}" = 0 ] || timeout 420 bash "$root/bench/gpu_scale.sh" "$build/examples/train_mlp_cuda" | tee -a "$results" || status=1

emit "{\"check\": \"gpu_check\", \"result\": \"$([ $status -eq 0 ] && echo OK || echo FAIL)\", \"seconds\": $(($(date +%s) - t0))}"
log "results in $results"
exit $status
