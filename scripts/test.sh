#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), builds (MPI required), and runs every test suite (meson
# test), then the sanitizer builds (scripts/sanitize.sh). Extra arguments go to meson test and select
# a subset: then no sanitizer build.
# ZERO_SANITIZE=0 skips the sanitizer builds.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --no-build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${ZERO_BUILD_DIR:-$root/build}
# A whole run ends with the sanitizer builds, which compile and run their asan suites under ASan +
# UBSan: this build leaves those suites out (-Dskip_suites), so that each is compiled once, not once
# by g++ here and once by clang there. host_loops stays: here it compiles at -O2, where the compiler
# vectorizes, and vectorized code is its subject. A run of selected suites (arguments) or without the
# sanitizers builds every suite here.
skip=()
if [ $# -eq 0 ] && [ "${ZERO_SANITIZE:-1}" != 0 ]; then
  for s in $("$root/scripts/sanitize.sh" --list asan); do
    case $s in host_loops | *_reader) ;; *) skip+=("$s") ;; esac
  done
fi
skip_option=$(IFS=,; echo "${skip[*]}")
# The programs at -Og (level g; train_mlp_cuda's host code at nvcc's -O0): the tests check their bits
# and refusals, not their speed, and the bits do not depend on the level. The trainers compile in 0.57
# of -O1's CPU time (their engine instantiations are most of the build), nvcc in 0.75; the benchmark
# scripts refuse this build for timings (bench/timed_build.sh).
# Without a CUDA device train_mlp_cuda only compiles and its command line is tested: its fp32 unit
# alone (the instantiation suites compile every precision's device engines), 2 of its 3 engine units
# (about 210 CPU-s) saved; and the programs that only run on a device (the gpu suite's executables,
# bench/gpu_optimizer: about 250 CPU-s) are not built (-Dgpu_device_programs=false).
gpu_precision=
device_programs=true
if ! { command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; }; then
  gpu_precision=fp32
  device_programs=false
fi
options=(-Dmpi=enabled -Dskip_suites="$skip_option" -Dgpu_trainer_optimization=g -Dexamples_optimization=g
         -Dtools_optimization=g -Dgpu_trainer_precision=$gpu_precision -Dgpu_device_programs=$device_programs)
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" "${options[@]}" >&2
else
  meson setup --reconfigure "$build" "$root" "${options[@]}" >&2
fi
meson compile -C "$build" >&2
# The whole suite includes MPI's (setup.sh configures -Dmpi=enabled): a build without it is refused
# rather than reported as passing.
if [ $# -eq 0 ] && ! meson test -C "$build" --no-rebuild --list --suite mpi 2>/dev/null | grep -q ' / '; then
  echo "scripts/test.sh: the build in $build registers no MPI test; MPI (Debian: libopenmpi-dev openmpi-bin) is" \
    "required to run the whole suite: configure with -Dmpi=enabled" >&2
  exit 1
fi
meson test -C "$build" --print-errorlogs "$@"
if [ $# -eq 0 ] && [ "${ZERO_SANITIZE:-1}" != 0 ]; then
  "$root/scripts/sanitize.sh"
fi
