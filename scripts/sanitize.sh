#!/usr/bin/env bash
# Builds and runs the CPU unit suites under ASan + UBSan (asan) and the thread-backend suites under TSan (tsan).
# Usage: scripts/sanitize.sh [asan|tsan]...   (default: both, as scripts/test.sh and so .ci/run run it)
#        scripts/sanitize.sh --list asan|tsan  (the suites of that kind, one per line; scripts/test.sh
#                                               leaves the compiled ones out of the main build)
#
# Each kind is a small build of its own (build-asan/, build-tsan/: beside $ZERO_BUILD_DIR if set): tests only,
# no CUDA, MPI, examples or benchmarks. Any report fails the run: ASan and TSan halt on the first error,
# UBSan is compiled with -fno-sanitize-recover so a finding aborts the test instead of printing a line.
#
# Compiler: clang++ ($ZERO_SANITIZE_CXX) with line tables, both kinds at -O0. Measured on test_offload.cpp
# (clang 14, 2-core machine): ASan + UBSan take 41 s of CPU at -O0 -g1 and 149 s at -O1 -g1 (g++ -O1
# about twice clang's); the whole ASan build took 149 s at -O0 in a clean CI run, and its suites about
# 1.7x as long as at -O1 (130 s of test time summed, against 77 s). TSan likewise: the engine suites
# compile in a third of -O1's CPU time (test_param_groups.cpp 21 s against 66 s; the whole TSan build
# 279 CPU-s, against about 1,000), the engine types the suites share come from one object at -O0
# (tests/engine_instances.hpp), and its suites take 81 s instead of 41 (121 CPU-s). At -O0 TSan also
# sees more interleavings: it found a rank freeing a collective's output on an abort while a peer still
# copied into it, which the -O1 build had passed.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
list=0
if [ "${1:-}" = --list ]; then
  list=1
  shift
else
  "$root/scripts/setup.sh" --no-build
fi

kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)

for kind in "${kinds[@]}"; do
  case $kind in
    asan)
      # clang's -fsanitize=undefined includes float-cast-overflow (an out-of-range float-to-integer
      # conversion), which g++'s leaves out.
      sanitize=address,undefined
      opt=-O0
      # The CPU unit suites that reach the library's memory handling: collectives, the engine's
      # buffers in every stage and precision and its options, the host loops, the quantizer (formulas
      # holds the ZeRO++ suite), checkpoints and their parsers, the offload tier. Left to the main
      # build, for the CI's time: plan and hyper_parameters, whose engine paths these cover.
      tests=(layout collectives equivalence formulas half_types state_access precision optimizers gpt_model host_loops
             options tied_weights errors checkpoint checkpoint_corruption checkpoint_kill checkpoint_async checkpoint_export offload
             checkpoint_python_reader safetensors_python_reader)
      targets=(tests/checkpoint_fixture tools/zero_export)
      ;;
    tsan)
      sanitize=thread
      opt=-O0
      # The suites where threads of one process meet: the collectives' rendezvous, the engine's
      # protocol over thread ranks in every stage (equivalence), failures crossing ranks (errors), a
      # manifest shared by the ranks of a process and their files (checkpoint, corruption, kill), the
      # offload tier's I/O thread. The equivalence suite without its parameter groups' file
      # (tests/meson.build: they meet threads as its other files do, and run under ASan). The engine's other suites (options, state_access, precision,
      # tied_weights) run the same collectives and are under ASan above. Not checkpoint_export: it
      # replaces the global operator new to measure memory, which TSan's runtime defines itself.
      tests=(collectives equivalence errors checkpoint checkpoint_corruption checkpoint_kill checkpoint_async offload)
      targets=()
      ;;
    *)
      echo "usage: scripts/sanitize.sh [asan|tsan]..." >&2
      exit 2
      ;;
  esac
  if [ $list = 1 ]; then
    printf '%s\n' "${tests[@]}"
    continue
  fi
  for t in "${tests[@]}"; do
    case $t in *_reader) ;; *) targets+=("tests/test_$t") ;; esac
  done
  build=${ZERO_BUILD_DIR:-$root/build}-$kind
  if [ ! -f "$build/build.ninja" ]; then
    # b_lundef=false: clang links the sanitizer runtimes in a way Meson's -Wl,--no-undefined refuses.
    CXX=${ZERO_SANITIZE_CXX:-clang++} meson setup "$build" "$root" -Db_sanitize="$sanitize" -Db_lundef=false \
      -Dbuildtype=plain -Dcpp_args="$opt -g1 -fno-omit-frame-pointer -fno-sanitize-recover=all" \
      -Dcuda=disabled -Dmpi=disabled -Dexamples=false -Dbench=false >&2
  fi
  start=$(date +%s)
  ninja -C "$build" "${targets[@]}" >&2
  built=$(date +%s)
  # Set here, not left to meson's defaults: the first report of any sanitizer fails the test.
  ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
    TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:second_deadlock_stack=1 \
    meson test -C "$build" --no-rebuild --print-errorlogs --timeout-multiplier "${ZERO_SANITIZE_TIMEOUT_MULTIPLIER:-3}" \
    "${tests[@]}"
  echo "sanitize $kind: build $((built - start)) s, tests $(($(date +%s) - built)) s" >&2
done
