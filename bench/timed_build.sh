# Sourced by the benchmark scripts that time programs of a build: refuses one whose programs compile
# without optimization. scripts/test.sh configures build/ with -Dexamples_optimization=g and
# -Dtools_optimization=g, the fastest to compile (only the tests run there, and the bits do not depend
# on the level), where the trainers' Muon steps, for one, run 5x slower than at -O1.
# Usage: require_timed_build BUILD_DIR OPTION...   (OPTION: examples_optimization, tools_optimization)
require_timed_build() {
  local build=$1 option level
  shift
  for option in "$@"; do
    level=$(meson introspect "$build" --buildoptions 2>/dev/null | python3 -c '
import json, sys
print(next((o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]), ""))' "$option" 2>/dev/null || true)
    case "$level" in
      0 | g)
        echo "$(basename "$0"): $build compiles at $option=$level (scripts/test.sh's level, for the tests);" \
          "a timing needs 1 or more: meson configure $build -D$option=1 (or --build DIR)" >&2
        exit 1 ;;
    esac
  done
}
