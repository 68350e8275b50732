#!/usr/bin/env bash
# Installs what is missing, builds (MPI required: scripts/setup.sh), and runs every test suite (meson
# test), then the sanitizer builds (scripts/sanitize.sh). Extra arguments go to meson test and select
# a subset: then no sanitizer build.
# ZERO_SANITIZE=0 skips the sanitizer builds.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=${ZERO_BUILD_DIR:-$root/build}
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
