#!/usr/bin/env bash
# Compiles every host header of include/zero on its own (a translation unit that includes only it), so a
# header that needs anything it does not include fails here. The .cuh headers: tests/cuda/headers/.
# Usage: run.sh INCLUDE_DIR COMPILER [ARGS...]
set -u
include=$1; shift
jobs=${HEADER_JOBS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# comm/backends/mpi.hpp and comm/mpi_session.hpp need <mpi.h>: its flags from the MPI compiler wrapper, where one exists.
mpi_flags=$(mpicxx --showme:compile 2>/dev/null || true)
export include work mpi_flags
check() {
  local rel=$1; shift
  local name=${rel//\//_}
  printf '#include "zero/%s"\n' "$rel" > "$work/$name.cpp"
  local extra=""
  case "$rel" in comm/mpi_session.hpp | comm/backends/mpi.hpp)
    if [ -z "$mpi_flags" ]; then echo "skip $rel (no MPI compiler wrapper for <mpi.h>)"; return 0; fi
    extra=$mpi_flags ;;
  esac
  # shellcheck disable=SC2086
  if log=$("$@" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -I"$include" $extra \
             "$work/$name.cpp" 2>&1); then
    echo "ok   $rel"
  else
    echo "FAIL $rel"; echo "$log" | head -20
    return 1
  fi
}
export -f check
headers=$(cd "$include/zero" && find . -name '*.hpp' | sed 's|^\./||' | sort)
[ -n "$headers" ] || { echo "no headers under $include/zero"; exit 1; }
out=$(printf '%s\n' $headers | xargs -P "$jobs" -I{} bash -c 'check "$@"' _ {} "$@")
echo "$out"
# The disk tier's checksums need <xxhash.h>; without it (ZERO_NO_XXHASH stands for its absence) the
# core headers still compile with the standard library alone, and the disk tier refuses at construction.
printf '#include "zero/zero.hpp"\n' > "$work/no_xxhash.cpp"
if log=$("$@" -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -ffp-contract=off -DZERO_NO_XXHASH \
           -I"$include" "$work/no_xxhash.cpp" 2>&1); then
  line="ok   zero.hpp with ZERO_NO_XXHASH"
else
  line="FAIL zero.hpp with ZERO_NO_XXHASH"; echo "$log" | head -20
fi
echo "$line"
out+=$'\n'"$line"
count=$(( $(printf '%s\n' $headers | wc -l) + 1 ))
failed=$(grep -c '^FAIL' <<<"$out")
skipped=$(grep -c '^skip' <<<"$out")
echo "$((count - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
