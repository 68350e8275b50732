#!/usr/bin/env bash
# Installs zero from SOURCE_ROOT into a temporary prefix (headers, pkg-config and CMake files: the
# devel install tag, nothing compiled), then builds tests/cmake_consumer against it with CMake and
# runs it: zero::zero carries its include folder, C++20, -ffp-contract=off and threads, and
# zero::checkpoint its dependencies; with MPI, a program linking zero::zero and MPI::MPI_CXX runs
# under mpirun (docs/integration.md's example). Usage: run.sh SOURCE_ROOT
set -eu
root=$1
command -v cmake >/dev/null || { echo "SKIP: cmake is not installed (Debian: cmake)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() {  # runs a command quietly; on failure shows its output
  "$@" >"$work/step.log" 2>&1 || { echo "FAIL: $*"; cat "$work/step.log"; exit 1; }
}
step meson setup "$work/zero-build" "$root" --prefix "$work/prefix" -Dtests=false -Dexamples=false -Dbench=false \
  -Dcuda=disabled -Dmpi=disabled
step meson install -C "$work/zero-build" --tags devel --no-rebuild
config=$(find "$work/prefix" -name zeroConfig.cmake)
[ -n "$config" ] || { echo "FAIL: no zeroConfig.cmake installed"; find "$work/prefix"; exit 1; }
echo "installed: ${config#"$work/prefix/"}"
cp "$root/tests/cmake_consumer/CMakeLists.txt" "$root/tests/cmake_consumer/consumer_checkpoint.cpp" \
  "$root/tests/cmake_consumer/consumer_mpi.cpp" "$root/tests/consumer/consumer.cpp" "$work/"
# Only the prefix: CMake must find zero there, not in the source tree. No build type: what is checked is
# what zero's targets carry, and the programs compile in half the time without the optimizer.
step cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE= \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
step cmake --build "$work/build" --parallel 2
python3 - "$work/build/compile_commands.json" "$work/prefix" <<'PY'
import json, sys
commands, prefix = json.load(open(sys.argv[1])), sys.argv[2]
assert len(commands) in (2, 3), commands  # consumer_mpi where CMake finds MPI
for c in commands:
    cmd = c["command"]
    for needed in ["-ffp-contract=off", "++20", prefix + "/include"]:  # -std=gnu++20; -isystem for imported targets
        assert needed in cmd, f"{needed} missing from: {cmd}"
print("compile flags: -ffp-contract=off, C++20 and the prefix's include folder on both")
PY
"$work/build/consumer"
"$work/build/consumer_checkpoint" "$work/ckpt"
if [ -x "$work/build/consumer_mpi" ]; then
  mpirun=$(command -v mpirun || command -v mpiexec) || { echo "FAIL: consumer_mpi built, but no mpirun"; exit 1; }
  # As the mpi suite runs Open MPI (tests/mpi/meson.build): as root, and without cross-process copies.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    "$mpirun" --oversubscribe -np 2 "$work/build/consumer_mpi"
else
  echo "consumer_mpi: CMake found no MPI, not built"
fi
# A component that does not exist is an error naming it.
mkdir "$work/missing"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(m CXX)\nfind_package(zero CONFIG REQUIRED COMPONENTS gpu)\n' \
  >"$work/missing/CMakeLists.txt"
if cmake -S "$work/missing" -B "$work/missing/build" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/missing.log" 2>&1; then
  echo "FAIL: find_package(zero COMPONENTS gpu) succeeded"; exit 1
fi
grep -q "no component 'gpu'" "$work/missing.log" || { echo "FAIL: message:"; cat "$work/missing.log"; exit 1; }
echo "1 passed, 0 failed"
