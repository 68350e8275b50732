#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (meson test; the CPU unit suites carry
# ASan + UBSan), then the thread-backend suites under TSan (scripts/sanitize.sh tsan). Extra arguments
# go to meson test and select a subset: then no TSan build. ZERO_SANITIZE=0 skips the TSan build.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
meson test -C "${ZERO_BUILD_DIR:-$root/build}" --print-errorlogs "$@"
if [ $# -eq 0 ] && [ "${ZERO_SANITIZE:-1}" != 0 ]; then
  "$root/scripts/sanitize.sh" tsan
fi
