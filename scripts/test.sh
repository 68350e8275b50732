#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (meson test). Extra arguments go to meson test.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
meson test -C "${ZERO_BUILD_DIR:-$root/build}" --print-errorlogs "$@"
